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
from nodetask.registry_credentials import RegistryAuth
from nodetask.route import Route, RouteError

__all__ = [
    "ATTEMPTS_CAPABILITY",
    "CACHE_CAPABILITY",
    "CACHE_CHUNKS_CAPABILITY",
    "CACHE_SECRETS_CAPABILITY",
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


class MessageError(ValueError):
    """A frame that is not a valid message; the text says what is wrong and where."""


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", rename="camel"):
    """Base of all wire messages."""


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


# Tunnels (:mod:`nodetask.tunnel`): a device's TLS connections to the API server, relayed by its hub.
# Both sides list TUNNEL_CAPABILITY (Hello, Welcome) before any of these flow.

TUNNEL_CAPABILITY: Final = "tunnel.v1"
"""The tunnel messages below and the data frames of :mod:`nodetask.tunnel`."""
MAX_TUNNEL: Final = 2**32 - 1
"""Highest tunnel number (a data frame carries it in four bytes)."""
TunnelNumber = Annotated[int, msgspec.Meta(ge=1, le=MAX_TUNNEL)]


class TunnelCredit(Message, frozen=True, tag="tunnel_credit"):
    """Both ways: the sender has read ``size`` more bytes of the tunnel; as many more may come."""

    stream: TunnelNumber
    size: Annotated[int, msgspec.Meta(ge=1, le=2**31)]


class TunnelClose(Message, frozen=True, tag="tunnel_close"):
    """Both ways: the tunnel is closed; with a ``reason`` it broke (and the reason says why)."""

    stream: TunnelNumber
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""


# --------------------------------------------------------------------------------------- cloud -> edge


class Welcome(Message, frozen=True, tag="welcome"):
    """The hub accepted a Hello."""

    hub: str
    heartbeat_interval: float
    capabilities: tuple[str, ...] = ()
    """What this hub understands beyond the first protocol (e.g. :data:`CACHE_CAPABILITY`): an edge sends
    a newer upstream message only to a hub that lists it, since an older hub would refuse the frame."""


# Edge autonomy (seed 003). Both sides list CACHE_CAPABILITY (Hello, Welcome) before any of these
# messages flow, so agents and hubs from before them never receive a frame they cannot decode.

CACHE_CAPABILITY: Final = "cache.v1"
"""The cache and autonomy messages below."""
CACHE_SECRETS_CAPABILITY: Final = "cache.secrets"
"""The edge keeps its node's Secrets (its config allows it); without it the hub never sends one."""
CACHE_CHUNKS_CAPABILITY: Final = "cache.chunks"
""":class:`CacheChunk`: a collection too large for one frame is sent as a replace in parts. Without it on
both sides such a collection goes object by object, as upserts (what the edge holds beyond them stays)."""


class CacheKey(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One cached object: its Kubernetes kind (``Node``, ``Pod``, ``ConfigMap``, ``Secret``) and name."""

    kind: str
    namespace: str = ""
    name: str


class CacheObjects(Message, frozen=True, tag="cache_objects"):
    """Objects of the edge's cache of its node's cloud state, as the API server serves them.

    Without ``replace`` each object is an upsert (an older ``resourceVersion`` than the cached one is
    ignored). With ``replace`` they are the whole collection of ``kind`` as listed at
    ``resource_version``: the edge swaps its collection for them in one step, and keeps its
    collection untouched when the hub could not list it (the hub then sends nothing). A collection
    too large for one frame goes as :class:`CacheChunk` parts to an edge listing
    :data:`CACHE_CHUNKS_CAPABILITY`.
    """

    kind: str
    objects: tuple[msgspec.Raw, ...] = ()
    replace: bool = False
    resource_version: str = ""


class CacheChunk(Message, frozen=True, tag="cache_chunk"):
    """One part of a replace too large for one frame (:mod:`nodetask.cache_chunks`): the collection of
    ``kind`` is the objects of every chunk of ``replace``, in ``seq`` order from 0 to the ``last`` one.

    The edge swaps its collection only once the last chunk has come with every one before it in
    order; a connection that ends before leaves the collection as it was.
    """

    kind: str
    replace: str
    """Names the replace: the same in each of its chunks, another for each replace of the session."""
    seq: int
    objects: tuple[msgspec.Raw, ...] = ()
    last: bool = False
    resource_version: str = ""
    """The collection's, as listed (the same in each chunk)."""
    kept: tuple[CacheKey, ...] = ()
    """Objects of the collection too large for any frame: the edge keeps what it holds of them."""


class CacheDeleted(Message, frozen=True, tag="cache_deleted"):
    """An object left the node's cache: deleted in the cloud, or no longer the node's to see."""

    key: CacheKey
    resource_version: str = ""


class Autonomy(Message, frozen=True, tag="autonomy"):
    """Whether the node asked for autonomy (its annotations), sent after Welcome and on every change."""

    requested: bool


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


class TunnelOpened(Message, frozen=True, tag="tunnel_opened"):
    """The hub connected the tunnel the edge opened to the API server: bytes may flow."""

    stream: TunnelNumber


# The node's client certificate, issued through the cluster's CSR API. Both sides list
# NODE_CREDENTIALS_CAPABILITY (Hello, Welcome) before either of these flows.

NODE_CREDENTIALS_CAPABILITY: Final = "node-credentials.v1"
""":class:`NodeCredentialsRequest` and its answer :class:`NodeCredentials`."""
MAX_REQUEST_ID: Final = 64
MAX_CSR_PEM: Final = 16 << 10
"""A PKCS#10 request in PEM: an EC P-256 one is about 500 bytes, an RSA 4096 one under 2 KiB."""
MAX_CERTIFICATE_PEM: Final = 64 << 10
"""The issued certificate in PEM, with any intermediates the signer adds."""
MAX_CA_BUNDLE_PEM: Final = 256 << 10
"""The CA bundle in PEM: a few hundred certificates."""
MAX_CREDENTIALS_ERROR: Final = 1024


class NodeCredentials(Message, frozen=True, tag="node_credentials"):
    """The answer to the :class:`NodeCredentialsRequest` ``id``: the signed certificate and the CA bundle the
    API server is verified with, or (``error`` not empty) why there is none. The edge checks both before it
    keeps them (the certificate's key must be its own, its subject the node's, and the CA its issuer)."""

    id: Annotated[str, msgspec.Meta(max_length=MAX_REQUEST_ID)]
    certificate: Annotated[str, msgspec.Meta(max_length=MAX_CERTIFICATE_PEM)] = ""
    ca_bundle: Annotated[str, msgspec.Meta(max_length=MAX_CA_BUNDLE_PEM)] = ""
    error: Annotated[str, msgspec.Meta(max_length=MAX_CREDENTIALS_ERROR)] = ""


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


class CacheFetch(Message, frozen=True, tag="cache_fetch"):
    """Send these objects again: the edge's repair loop, for keys it failed to store. The hub answers
    each with :class:`CacheObjects` or, when the object is gone or not the node's, :class:`CacheDeleted`."""

    keys: tuple[CacheKey, ...]


class AutonomyCondition(Message, frozen=True, tag="autonomy_condition"):
    """The edge's ``Autonomy`` condition changed (``nodetask.autonomy.check``); the hub writes it on the Node."""

    status: str
    reason: str
    message: str = ""


class TunnelOpen(Message, frozen=True, tag="tunnel_open"):
    """Open tunnel ``stream`` to the API server (the hub's; the edge names no address)."""

    stream: TunnelNumber


class NodeCredentialsRequest(Message, frozen=True, tag="node_credentials_request"):
    """Have the node's certificate signed: ``csr`` is a PKCS#10 request in PEM for CN ``system:node:<node>``,
    O ``system:nodes``, made with a key that never leaves the device. Answered with :class:`NodeCredentials`
    of the same ``id``; one at a time per node."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID)]
    csr: Annotated[str, msgspec.Meta(max_length=MAX_CSR_PEM)]


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
