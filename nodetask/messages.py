"""Wire messages between cloud hubs and edge agents, and their codec.

Every frame is one JSON object tagged by ``op``; there is one union per direction. Schema evolution
rules (msgspec's): a field added after v1 gets a default, no field changes type, and unknown fields
are ignored so that an old hub and a new edge (or the reverse) still talk during an upgrade. A field
that replaces an older one goes only to peers whose Hello names a capability for it, and the older
field to the others (:data:`nodetask.registry_credentials.TYPED_CREDENTIALS`).

The upstream report carries KubeEdge's body keys ``{action, succ, finishTime, reason, extend}``
plus what reliable delivery needs: the job UID (so a re-created job is never confused with its
predecessor) and ``seq``, the edge outbox position the hub acknowledges.

Attempts (added for retries): a node task is the job UID *and* its attempt, 1 unless the job was
retried. ``RunAction.attempt`` says which one to run, and the edge keys its task by both, so a
retry is new work there, never mistaken for a re-delivery; ``Report.attempt`` says which attempt a
result belongs to, so the hub applies it only to that attempt. An agent that knows attempts says so
with :data:`ATTEMPTS_CAPABILITY` in its Hello. Older peers leave the fields out, and 0 stands for
that: a Report without an attempt applies to the node's current attempt (as before retries
existed), a RunAction without one runs attempt 1, a Cancel or Confirm without one means any
attempt. An older agent would take a retry's RunAction for a re-delivery of the first attempt, so
the hub never sends it one: its node fails with the reason instead.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Final

import msgspec

from nodetask import nesting
from nodetask.cache_messages import (
    CACHE_CAPABILITY,
    CACHE_CHUNKS_CAPABILITY,
    CACHE_SECRETS_CAPABILITY,
    Autonomy,
    AutonomyCondition,
    CacheChunk,
    CacheDeleted,
    CacheFetch,
    CacheKey,
    CacheObjects,
)
from nodetask.message_base import Message, MessageError
from nodetask.registry_credentials import RegistryAuth
from nodetask.relay_messages import (
    NODE_CREDENTIALS_CAPABILITY,
    TUNNEL_CAPABILITY,
    NodeCredentials,
    NodeCredentialsRequest,
    TunnelClose,
    TunnelCredit,
    TunnelOpen,
    TunnelOpened,
)
from nodetask.route import Route, RouteError

__all__ = [
    "ATTEMPTS_CAPABILITY",
    "CACHE_CAPABILITY",
    "CACHE_CHUNKS_CAPABILITY",
    "CACHE_SECRETS_CAPABILITY",
    "KUBELET_CAPABILITY",
    "NODE_CREDENTIALS_CAPABILITY",
    "PING_CAPABILITY",
    "TUNNEL_CAPABILITY",
    "Ack",
    "ActionResult",
    "Autonomy",
    "AutonomyCondition",
    "CacheChunk",
    "CacheDeleted",
    "CacheFetch",
    "CacheKey",
    "CacheObjects",
    "Cancel",
    "Confirm",
    "Downstream",
    "Error",
    "Heartbeat",
    "Hello",
    "Message",
    "MessageError",
    "NodeCredentials",
    "NodeCredentialsRequest",
    "Report",
    "ReportAck",
    "RunAction",
    "TunnelClose",
    "TunnelCredit",
    "TunnelOpen",
    "TunnelOpened",
    "Upstream",
    "Welcome",
    "decode_downstream",
    "decode_upstream",
    "encode",
]


ROUTE_CACHE_SIZE: Final = 16384
"""Parsed routes kept (one per node task in flight is what a hub needs)."""


ATTEMPTS_CAPABILITY: Final = "attempts"
"""In a Hello's capabilities: the agent keys its node tasks by job UID and attempt, and reports the attempt."""
KUBELET_CAPABILITY: Final = "kubelet.v1"
"""In a Hello's capabilities: the agent reads a node job's ``component`` and runs ``component: kubelet`` on the
node's kubelet. An older agent ignores the field and would take such a job for one about itself, so the hub
never sends it one: its node fails with the reason instead."""


class ActionResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """KubeEdge's upstream body: the result of one action on one node."""

    action: str
    succ: bool
    finish_time: str = ""
    """RFC 3339 UTC time the action finished."""
    reason: str = ""
    extend: str = ""
    """Job-type specific payload: ``"from,to"`` versions for upgrades, image statuses as JSON for pre-pulls."""


# --------------------------------------------------------------------------------------------- both ways


class Heartbeat(Message, frozen=True, tag="heartbeat"):
    """Keeps a session alive. The edge sends one every ``heartbeat_interval``; the hub echoes it, so
    each side sees a frame at least that often and treats three silent intervals as a dead session.
    Between peers that both list :data:`PING_CAPABILITY`, a websocket ping does this job instead."""

    sent_at: float = 0.0


PING_CAPABILITY: Final = "ping.v1"
"""Listed in Hello and Welcome: the edge keeps the session alive with a websocket ping every
``heartbeat_interval`` instead of a Heartbeat frame. The hub's transport answers each with a pong
without waking the hub's session code; three intervals in which nothing arrived, ping or frame,
still end the session on either side. A hub that does not list it is sent Heartbeats, and a hub
still echoes the Heartbeats of agents that do not list it."""


class Error(Message, frozen=True, tag="error"):
    """The peer sent something this side cannot accept. ``code`` is stable, ``message`` is for humans.

    Answering a report (``ref`` is its ``seq``), ``report_rejected`` (it can never be applied, e.g. an
    unknown action) and ``job_gone`` (its job no longer exists) are final: the edge drops the report.
    Any other code leaves it in the outbox to be sent again.
    """

    code: str
    message: str
    ref: str = ""
    """The id or seq of the refused message, when it could be read."""


# --------------------------------------------------------------------------------------- cloud -> edge


class Welcome(Message, frozen=True, tag="welcome"):
    """The hub accepted a Hello."""

    hub: str
    heartbeat_interval: float
    capabilities: tuple[str, ...] = ()
    """What this hub understands beyond the first protocol (e.g. :data:`CACHE_CAPABILITY`): an edge sends
    a newer upstream message only to a hub that lists it, since an older hub would refuse the frame."""


class RunAction(Message, frozen=True, tag="run_action"):
    """Start (or resume) a node task at ``action``. The edge acknowledges with :class:`Ack` once stored."""

    id: str
    route: Route
    job_uid: str
    action: str
    spec: msgspec.Raw
    """The job's spec as JSON, decoded by the job type on the edge."""
    credentials: dict[str, str] = {}
    """The string form of :attr:`registry_credentials` (``roles.common.registry_auth.encode_credentials``), which
    is all that agents without the :data:`TYPED_CREDENTIALS` capability read."""
    credentials_error: str = ""
    """Why the job's ``imageSecrets`` could not be resolved; the edge fails its pulls with it."""
    registry_credentials: dict[str, RegistryAuth] = {}
    """Image reference to its registry's credentials, resolved by the cloud from the job's
    ``imageSecrets`` and sent only to that job's nodes (those with the :data:`TYPED_CREDENTIALS` capability)."""
    attempt: int = 0
    """Which attempt at the node task this is (1 unless retried); 0 from a hub that knows no attempts: the first."""


class ReportAck(Message, frozen=True, tag="report_ack"):
    """The hub has durably applied the report with this ``seq``; the edge may forget it."""

    job_uid: str
    seq: int


class Confirm(Message, frozen=True, tag="confirm"):
    """Release a node task waiting for confirmation."""

    route: Route
    job_uid: str
    attempt: int = 0
    """The attempt released; 0: whichever waits."""


class Cancel(Message, frozen=True, tag="cancel"):
    """The job is gone or interrupted; stop the node task if it has not passed a point of no return."""

    route: Route
    job_uid: str
    attempt: int = 0
    """The attempt to stop; 0: whichever runs."""


# --------------------------------------------------------------------------------------- edge -> cloud


MAX_VERSION: Final = 128
"""Longest agent version a Hello may carry."""


class Hello(Message, frozen=True, tag="hello"):
    """First frame of a session: who the edge is."""

    node: str
    version: Annotated[str, msgspec.Meta(max_length=MAX_VERSION)]
    """The agent's version, as the hub records it on the Node (so it is bounded like a label value's worth)."""
    capabilities: tuple[str, ...] = ()


class Ack(Message, frozen=True, tag="ack"):
    """The edge has stored the :class:`RunAction` with this id."""

    id: str


class Report(Message, frozen=True, tag="report"):
    """The result of one action, from the edge's outbox."""

    route: Route
    job_uid: str
    seq: int
    action: str
    succ: bool
    finish_time: str = ""
    reason: str = ""
    extend: str = ""
    attempt: int = 0
    """The attempt the result belongs to; 0 from an agent that knows no attempts: the node's current one."""

    @property
    def result(self) -> ActionResult:
        """The KubeEdge-shaped body of this report."""
        return ActionResult(
            action=self.action, succ=self.succ, finish_time=self.finish_time, reason=self.reason, extend=self.extend
        )


Downstream = (
    Welcome
    | RunAction
    | ReportAck
    | Confirm
    | Cancel
    | Heartbeat
    | Error
    | CacheObjects
    | CacheChunk
    | CacheDeleted
    | Autonomy
    | TunnelOpened
    | TunnelCredit
    | TunnelClose
    | NodeCredentials
)
Upstream = (
    Hello
    | Ack
    | Report
    | Heartbeat
    | Error
    | CacheFetch
    | AutonomyCondition
    | TunnelOpen
    | TunnelCredit
    | TunnelClose
    | NodeCredentialsRequest
)


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, Route):
        return str(obj)
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


@functools.lru_cache(maxsize=ROUTE_CACHE_SIZE)
def parse_route(text: str) -> Route:
    """:meth:`Route.parse`, memoised: what the decoders use for every route on the wire."""
    # A hub sees the same route in every report of a node task; parsing a new one is most of a
    # report's decode time (docs/benchmarks.md), so each is parsed once.
    # Routes are immutable values, so sharing one instance between messages is safe.
    return Route.parse(text)


def _dec_hook(tp: type, obj: Any) -> Any:
    if tp is Route:
        # Whatever the peer sent, a malformed route is a validation error (msgspec names the field):
        # NotImplementedError, meant for unsupported types, would escape the decoder as a crash.
        if not isinstance(obj, str):
            raise TypeError(f"expected a route string, got {type(obj).__name__}")
        try:
            return parse_route(obj)
        except RouteError as exc:
            raise ValueError(str(exc)) from None
    raise NotImplementedError(f"cannot decode {tp!r}")


_ENCODER: Final = msgspec.json.Encoder(enc_hook=_enc_hook)
_UP: Final = msgspec.json.Decoder(Upstream, dec_hook=_dec_hook)
_DOWN: Final = msgspec.json.Decoder(Downstream, dec_hook=_dec_hook)
_RESULT: Final = msgspec.json.Decoder(ActionResult)


def encode(msg: Message | ActionResult) -> bytes:
    """One frame's bytes."""
    return _ENCODER.encode(msg)


def _decode(decoder: msgspec.json.Decoder[Any], frame: bytes | str, direction: str) -> Any:
    try:
        # msgspec recurses once per level even to skip an unknown field, and its RecursionError is
        # not a DecodeError: without the guard one deep frame ends the hub.
        nesting.check_json(frame)
        return decoder.decode(frame)
    except msgspec.DecodeError as exc:
        raise MessageError(f"malformed {direction} frame: {exc}") from None


def decode_upstream(frame: bytes | str) -> Upstream:
    """Decode a frame an edge sent. Errors: :class:`MessageError` naming the bad field, or the nesting
    limit (:data:`nesting.MAX_DEPTH`) for a frame nested deeper."""
    msg: Upstream = _decode(_UP, frame, "upstream")
    return msg


def decode_downstream(frame: bytes | str) -> Downstream:
    """Decode a frame a hub sent. Errors: :class:`MessageError` naming the bad field or the nesting limit."""
    msg: Downstream = _decode(_DOWN, frame, "downstream")
    return msg


def decode_result(body: bytes | str) -> ActionResult:
    """Decode KubeEdge's upstream body (the HTTP status endpoint's payload); errors as :func:`decode_upstream`."""
    result: ActionResult = _decode(_RESULT, body, "action result")
    return result
