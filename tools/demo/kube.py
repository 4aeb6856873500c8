"""What the demo reads and writes in the API server, over plain HTTPS as the cluster admin.

Why not the project's Kube client: the demo is a synchronous script that polls a few lists once a
second and registers a fleet once; a dozen lines of ``urllib`` (TLS verified against the cluster's
CA) keep it free of the trio/asyncio bridge and of one kubectl process per poll.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from roles.cloud.transport.auth import token_secret
from schemas.core import EDGE_ROLE_LABEL, HUB_ANNOTATION
from schemas.kinds import KINDS

TOKEN_NAMESPACE: Final = "kube-system"
"""Where the hubs look up the edges' token Secrets (CloudConfig.tokenNamespace's default)."""
EVENT_NAMESPACE: Final = "default"
"""Where the controller records Events about (cluster-scoped) jobs."""
GROUP_VERSION: Final = "operations.kubeedge.io/v1alpha2"


class ApiFailure(RuntimeError):
    """An API request failed; the message names the request and the server's answer."""


@dataclass(frozen=True)
class Api:
    """The API server at ``server``, authenticated with a bearer ``token``."""

    server: str
    token: str
    context: ssl.SSLContext
    timeout: float = 10.0

    def request(self, method: str, path: str, body: object = None, *, patch: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.server}{path}", data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/merge-patch+json" if patch else "application/json")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout, context=self.context) as answer:
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            with contextlib.suppress(ValueError, AttributeError):  # a Status object, or plain text
                detail = json.loads(detail).get("message", detail)
            raise ApiFailure(f"{method} {path}: HTTP {exc.code}: {detail}") from None
        except OSError as exc:
            raise ApiFailure(f"{method} {path}: {exc}") from None

    def get(self, path: str) -> Any:
        return self.request("GET", path)


def register_edge(api: Api, name: str, labels: Mapping[str, str]) -> str:
    """Create a Ready edge Node as a kubelet would and its token Secret; returns the token."""
    api.request("POST", "/api/v1/nodes", {"metadata": {"name": name, "labels": {EDGE_ROLE_LABEL: "", **labels}}})
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "registered by the demo"}
    api.request("PATCH", f"/api/v1/nodes/{name}/status", {"status": {"conditions": [ready]}}, patch=True)
    return register_token(api, name)


def register_token(api: Api, name: str) -> str:
    """Create node ``name``'s token Secret (its Node is the kubelet's to register); returns the token."""
    token = secrets.token_urlsafe(24)
    secret = msgspec.to_builtins(token_secret(name, token, namespace=TOKEN_NAMESPACE))
    api.request("POST", f"/api/v1/namespaces/{TOKEN_NAMESPACE}/secrets", secret)
    return token


def hubs_of_nodes(api: Api) -> dict[str, str]:
    """Each Node's hub annotation (empty when no hub holds its session)."""
    nodes = api.get("/api/v1/nodes")["items"]
    return {n["metadata"]["name"]: n["metadata"].get("annotations", {}).get(HUB_ANNOTATION, "") for n in nodes}


@dataclass(frozen=True)
class PreviousAttempt:
    """How a retried node's attempt before the latest one ended (``previousAttempt``)."""

    attempt: int
    phase: str
    action: str
    reason: str


@dataclass(frozen=True)
class NodeEntry:
    """One node of a job, as the job status says."""

    name: str
    phase: str
    reason: str
    last_action: str
    last_action_ok: bool
    attempt: int = 1
    previous: PreviousAttempt | None = None


@dataclass(frozen=True)
class JobView:
    """A job's status in the terms the demo shows."""

    kind: str
    name: str
    phase: str
    reason: str
    counts: Mapping[str, int]
    """``nodeCounts``: total, pending, inProgress, successful, failure, unknown."""
    nodes: Sequence[NodeEntry]
    run: int = 1
    """The job's run: 1, then one more per retry (``status.retry.attempt``)."""

    @property
    def ended(self) -> bool:
        return (
            self.phase in ("Completed", "Failure")
            and not self.counts.get("pending")
            and not (self.counts.get("inProgress"))
        )

    @property
    def done(self) -> int:
        return sum(self.counts.get(k, 0) for k in ("successful", "failure", "unknown"))


def list_jobs(api: Api) -> list[JobView]:
    """Every node job of the three kinds, read at the stored version (v1alpha2)."""
    views: list[JobView] = []
    for kind in KINDS:
        for job in api.get(f"/apis/{GROUP_VERSION}/{kind.plural}")["items"]:
            status = job.get("status") or {}
            entries = []
            for entry in status.get("nodeStatus") or ():
                flow = entry.get("actionFlow") or [{}]
                previous = entry.get("previousAttempt")
                entries.append(
                    NodeEntry(
                        name=entry.get("nodeName", ""),
                        phase=entry.get("phase", ""),
                        reason=entry.get("reason", ""),
                        last_action=flow[-1].get("action", ""),
                        last_action_ok=flow[-1].get("status") == "True",
                        attempt=entry.get("attempt", 1),
                        previous=None
                        if previous is None
                        else PreviousAttempt(
                            attempt=previous.get("attempt", 1),
                            phase=previous.get("phase", ""),
                            action=previous.get("action", ""),
                            reason=previous.get("reason", ""),
                        ),
                    )
                )
            views.append(
                JobView(
                    kind=kind.kind,
                    name=job["metadata"]["name"],
                    phase=status.get("phase", ""),
                    reason=status.get("reason", ""),
                    counts=status.get("nodeCounts") or {},
                    nodes=tuple(entries),
                    run=(status.get("retry") or {}).get("attempt", 1),
                )
            )
    return views


@dataclass(frozen=True)
class EventView:
    time: str
    type: str
    object: str
    reason: str
    message: str


def recent_events(api: Api, limit: int) -> list[EventView]:
    """The last ``limit`` Events about node jobs, oldest first."""
    kinds = {k.kind for k in KINDS}
    events: list[tuple[int, EventView]] = []
    for e in api.get(f"/api/v1/namespaces/{EVENT_NAMESPACE}/events")["items"]:
        involved = e.get("involvedObject") or {}
        if involved.get("kind") not in kinds:
            continue
        stamp = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp", "")
        events.append(
            (
                int(e["metadata"].get("resourceVersion", "0")),
                EventView(
                    time=stamp,
                    type=e.get("type", ""),
                    object=involved.get("name", ""),
                    reason=e.get("reason", ""),
                    message=e.get("message", ""),
                ),
            )
        )
    # resourceVersion orders creations (the controller only ever creates Events); timestamps tie.
    events.sort(key=lambda pair: pair[0])
    return [e for _, e in events[-limit:]]
