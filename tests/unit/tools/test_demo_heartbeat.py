"""The demo's heartbeat creates each agent-only edge's Lease once, then only moves its renewTime forward."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from tools.demo.heartbeat import LEASE_NAMESPACE, Heartbeat, micro_time
from tools.demo.kube import ApiFailure

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"


@dataclass
class RecordingApi:
    """Records requests instead of sending them; fails those to a path in ``failing``."""

    sent: list[tuple[str, str, Any, bool]] = field(default_factory=list)
    failing: set[str] = field(default_factory=set)

    def request(self, method: str, path: str, body: object = None, *, patch: bool = False) -> Any:
        if path in self.failing:
            raise ApiFailure(f"{method} {path}: HTTP 503: the API server is restarting")
        self.sent.append((method, path, body, patch))
        return {}


def test_micro_time_is_utc_with_microseconds() -> None:
    """A renewTime is written as Kubernetes' MicroTime, converted to UTC."""
    moment = datetime(2026, 11, 29, 19, 4, 5, 123456, tzinfo=timezone(timedelta(hours=1)))
    assert micro_time(moment) == "2026-11-29T18:04:05.123456Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", micro_time(datetime.now(UTC)))


def test_the_first_beat_creates_each_lease_and_later_beats_patch_its_renew_time() -> None:
    """Each node's Lease is POSTed with its holder once; every later beat sends only a renewTime."""
    api = RecordingApi()
    heartbeat = Heartbeat(api, ["edge-01", "edge-02"])
    heartbeat.beat()
    heartbeat.beat()
    posts, patches = api.sent[:2], api.sent[2:]
    assert [(method, path) for method, path, _, _ in posts] == [("POST", LEASES), ("POST", LEASES)]
    assert [body["spec"]["holderIdentity"] for _, _, body, _ in posts] == ["edge-01", "edge-02"]
    assert [(method, path, merge) for method, path, _, merge in patches] == [
        ("PATCH", f"{LEASES}/edge-01", True),
        ("PATCH", f"{LEASES}/edge-02", True),
    ]
    assert all(set(body["spec"]) == {"renewTime"} for _, _, body, _ in patches)


def test_a_failed_renewal_is_kept_as_the_problem_and_tried_again() -> None:
    """A renewal the API server refuses is remembered for the summary, and the next beat renews again."""
    api = RecordingApi()
    heartbeat = Heartbeat(api, ["edge-01"])
    heartbeat.beat()
    api.failing.add(f"{LEASES}/edge-01")
    heartbeat.renew()
    assert "HTTP 503" in heartbeat.problem
    api.failing.clear()
    heartbeat.renew()
    assert api.sent[-1][:2] == ("PATCH", f"{LEASES}/edge-01")
    assert len(api.sent) == 2
