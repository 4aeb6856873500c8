"""An API outage is logged once when it starts and once when it ends, whatever the number of tries between."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import structlog
from hypothesis import given
from hypothesis import strategies as st

from roles.kube import ApiError, NotFound
from roles.kube.resources import NODES, Resource
from roles.kube.retrying import Outage, read_through_outage
from schemas.core import Node
from schemas.meta import ObjectMeta

T = TypeVar("T", bound=msgspec.Struct)


@given(st.integers(min_value=1, max_value=40))
def test_an_outage_logs_one_warning_then_debug_lines_then_one_recovery(failures: int) -> None:
    """However many tries fail, one warning starts the outage and one api_recovered ends it."""
    with structlog.testing.capture_logs() as logs:
        outage = Outage(structlog.get_logger(), "report_write_retry", initial=0.2, cap=5.0)
        delays = [outage.failed(f"403 Forbidden #{i}") for i in range(failures)]
        outage.recovered()
        outage.recovered()  # nothing failed since: nothing to say
    levels = [(e["event"], e["log_level"]) for e in logs]
    assert levels == [
        ("report_write_retry", "warning"),
        *[("report_write_retry", "debug")] * (failures - 1),
        ("api_recovered", "info"),
    ]
    assert logs[-1]["failures"] == failures
    assert all(0.1 <= d <= 5.0 for d in delays)


def test_the_backoff_grows_during_an_outage_and_starts_over_after_it() -> None:
    """Delays double up to the cap while failures go on; after a recovery the first delay is short again."""
    outage = Outage(structlog.get_logger(), "watch_failed", initial=1.0, cap=8.0)
    ceilings = [outage.failed("x") for _ in range(6)]
    assert ceilings[0] <= 1.0
    assert ceilings[-1] >= 4.0
    outage.recovered()
    assert outage.failed("x") <= 1.0


class _FlakyNodes:
    """Node reads that fail ``failures`` times with a 503, then find ``present`` Nodes only."""

    def __init__(self, failures: int, present: set[str]) -> None:
        self.failures = failures
        self.present = present
        self.tries = 0

    async def get(self, resource: Resource[T], name: str, *, namespace: str = "") -> T:
        self.tries += 1
        if self.tries <= self.failures:
            raise ApiError(503, "ServiceUnavailable", "warming up")
        if name not in self.present:
            raise NotFound(404, "NotFound", f'nodes "{name}" not found')
        return Node(metadata=ObjectMeta(name=name))  # type: ignore[return-value]


async def test_a_read_through_an_outage_returns_the_object_or_none_once_the_api_answers(autojump_clock: object) -> None:
    """Failures are waited out and logged once; an existing object comes back, a missing one is None."""
    flaky = _FlakyNodes(failures=3, present={"edge-1"})
    with structlog.testing.capture_logs() as logs:
        found = await read_through_outage(flaky, NODES, "edge-1", log=structlog.get_logger(), event="node_read_retry")
    assert found is not None
    assert found.metadata.name == "edge-1"
    assert flaky.tries == 4
    assert [e["log_level"] for e in logs] == ["warning", "debug", "debug", "info"]
    missing = await read_through_outage(flaky, NODES, "edge-2", log=structlog.get_logger(), event="node_read_retry")
    assert missing is None
