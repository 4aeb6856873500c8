"""The controller's admission webhooks for node jobs and the diagnosis kinds: answering reviews.

``POST /validate`` (:data:`VALIDATE_PATH`) admits a job only if it follows ``schemas.validation``,
and an Operation, OperationSet, Diagnosis or Task only if it follows
``schemas.diagnosis.validation``; ``POST /mutate`` (:data:`MUTATE_PATH`) answers with a JSON Patch
that sets the defaults (a job's ``concurrency`` and ``timeoutSeconds``; an Operation's timeout,
scheme and path, an OperationSet's node ids, a Diagnosis's ``stagePolicy``). Tasks are not sent to
the mutating webhook: they have no defaults, and the controller creates one per node and stage.
Both take and give ``admission.k8s.io/v1`` AdmissionReviews; a body that is not one gets 400 with
the reason, as does one nested deeper than ``nesting.MAX_DEPTH`` (the rules walk the object
recursively), or one whose uid, name or kind is longer than any the API server sends.

What one review can cost is bounded, since anyone who can reach the port (or create objects, even
as a dry run) chooses what is in it: the body is limited by the server (``webhookMaxBodyBytes``);
it is decoded and checked in a worker thread, one review at a time, so the event loop goes on
renewing the leader Lease meanwhile; the rules name at most ``MAX_ERRORS`` errors and stop there;
a denial shows each error clipped to :data:`ERROR_CHARS` characters, and the log line of a decision
clips its reason to :data:`LOGGED_REASON_CHARS`.

Which requests reach these routes, and what happens while the controller is down, is the webhook
configurations' part: :mod:`roles.controller.admission.registration`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import anyio
import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter

from nodetask import nesting
from nodetask.names import clip
from roles.common.config import ControllerConfig, EdgeConfig
from roles.common.health import HttpRoute, Request, Response
from schemas.checker import MAX_ERRORS, FieldError, PatchOperation, capped
from schemas.diagnosis import v1 as diagnosis
from schemas.diagnosis import validation as diagnosis_validation
from schemas.diagnosis.kinds import DIAGNOSIS_KINDS
from schemas.job_updates import validate_update
from schemas.kinds import KINDS
from schemas.validation import AdmissionPolicy, default_patch, validate_create

__all__ = [
    "ERROR_CHARS",
    "LOGGED_REASON_CHARS",
    "MUTATE_PATH",
    "VALIDATE_PATH",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "admission_policy",
    "admission_routes",
    "denial_message",
]

Log = structlog.typing.FilteringBoundLogger

VALIDATE_PATH: Final = "/validate"
MUTATE_PATH: Final = "/mutate"
ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"

_INVALID: Final = 422
"""The HTTP status the API server answers a denied request with (``kubectl`` shows the message)."""
ERROR_CHARS: Final = 512
"""Characters of one error a denial shows: an error quoting a value sent (``got '...'``) shows its start."""
LOGGED_REASON_CHARS: Final = 2048
"""Characters of a denial's message in its log line."""
_NAME_CHARS: Final = 253
"""The longest object name, kind or resource name the API server sends (a DNS subdomain)."""
_UID_CHARS: Final = 128
"""Longer than any UID (36 characters): the uid is echoed in the answer, so it is bounded too."""
_LOGGED_PATCHES: Final = MAX_ERRORS
"""Patched paths named in a mutating decision's log line (the count is logged too)."""

_Name = Annotated[str, msgspec.Meta(max_length=_NAME_CHARS)]


class GroupVersionKind(msgspec.Struct, frozen=True, kw_only=True):
    group: _Name = ""
    version: _Name = ""
    kind: _Name = ""


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The fields of an ``AdmissionRequest`` used here; objects stay raw JSON for the rules.

    The strings that go into the answer and the log line are as long at most as the API server's.
    """

    uid: Annotated[str, msgspec.Meta(max_length=_UID_CHARS)]
    kind: GroupVersionKind
    operation: _Name
    name: _Name = ""
    namespace: _Name = ""
    sub_resource: _Name = ""
    object: Any = None
    old_object: Any = None
    dry_run: bool = False


class StatusResult(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The ``metav1.Status`` of a denial: its message is what the user sees."""

    code: int = 0
    reason: str = ""
    message: str = ""


class AdmissionResponse(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    uid: str
    allowed: bool
    status: StatusResult | None = None
    patch_type: str | None = None
    patch: bytes | None = None
    """The JSON Patch document; msgspec encodes bytes as base64, as the API expects."""


class AdmissionReview(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    # No defaults on apiVersion/kind: they are always encoded, and a review without them is refused.
    api_version: str
    kind: str
    request: AdmissionRequest | None = None
    response: AdmissionResponse | None = None


_REVIEW_DECODER: Final = msgspec.json.Decoder(AdmissionReview)
_ENCODER: Final = msgspec.json.Encoder()
_KNOWN_KINDS: Final = frozenset(k.kind for k in (*KINDS, *DIAGNOSIS_KINDS))


def _read_review(body: bytes) -> AdmissionRequest | Response:
    """The review's request, or the 400 response that says why there is none."""
    try:
        nesting.check_json(body)
        review = _REVIEW_DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Response.text(400, f"not an AdmissionReview: {clip(str(exc), ERROR_CHARS)}")
    if review.api_version != ADMISSION_API_VERSION or review.kind != "AdmissionReview":
        got = clip(f"{review.api_version} {review.kind}", ERROR_CHARS)
        return Response.text(400, f"expected {ADMISSION_API_VERSION} AdmissionReview, got {got}")
    if review.request is None:
        return Response.text(400, "the AdmissionReview has no request")
    return review.request


def _answer(response: AdmissionResponse) -> Response:
    review = AdmissionReview(api_version=ADMISSION_API_VERSION, kind="AdmissionReview", response=response)
    return Response.json(200, _ENCODER.encode(review))


def admission_policy(cfg: ControllerConfig) -> AdmissionPolicy:
    """What the webhook admits beyond the job schemas: the edge configuration's updatable settings, and
    image secrets from the namespaces ``cfg`` allows, and Diagnoses of at most ``diagnosisMaxTargets`` targets."""
    return AdmissionPolicy(
        updatable_edge_fields=EdgeConfig.UPDATABLE_FIELDS,
        edge_config=EdgeConfig,
        image_secret_namespaces=cfg.image_secret_namespaces,
        diagnosis_max_targets=cfg.diagnosis_max_targets,
    )


def denial_message(errors: tuple[FieldError, ...]) -> str:
    """What a denial says: the errors (at most ``MAX_ERRORS``, then how many more), each clipped."""
    return "; ".join(clip(str(e), ERROR_CHARS) for e in capped(errors))


def _validated(body: bytes, policy: AdmissionPolicy) -> tuple[AdmissionRequest, tuple[FieldError, ...]] | Response:
    """The review in ``body`` and what the rules find wrong with its object; pure, so it runs in a thread."""
    req = _read_review(body)
    return req if isinstance(req, Response) else (req, _errors(req, policy))


def _defaulted(body: bytes) -> tuple[AdmissionRequest, tuple[PatchOperation, ...]] | Response:
    """The review in ``body`` and the defaults its object lacks; pure, so it runs in a thread."""
    req = _read_review(body)
    if isinstance(req, Response):
        return req
    # UPDATE too: a replace that leaves the defaults out gets them back, so its spec still equals
    # the stored one and passes the immutability rule.
    wanted = req.operation in ("CREATE", "UPDATE") and not req.sub_resource
    return req, _defaults(req) if wanted else ()


def admission_routes(*, policy: AdmissionPolicy, registry: CollectorRegistry, log: Log) -> tuple[HttpRoute, ...]:
    """The two webhook routes, admitting what ``policy`` allows and counting decisions in ``registry``.

    The counter ``nodetaskd_controller_admission_decisions_total`` has labels ``webhook`` (validating,
    mutating), ``kind`` (the job or diagnosis kind, ``other`` for anything else) and ``allowed``.
    Reviews are decoded and checked in a worker thread, one at a time (both routes share it): the
    checks are pure, and a large object must not hold up the event loop, whose Lease renewals are
    due every few seconds.
    """
    # One at a time: the loop's thread and this one share the GIL anyway, and a second decoded
    # review would only double what the largest body costs in memory.
    checking = anyio.CapacityLimiter(1)
    decisions = Counter(
        "nodetaskd_controller_admission_decisions",
        "Admission decisions on node jobs, by webhook, kind and outcome.",
        ["webhook", "kind", "allowed"],
        registry=registry,
    )

    def record(webhook: str, req: AdmissionRequest, *, allowed: bool, **details: object) -> None:
        # Kinds are capped to the known ones: the label must not grow with whatever a caller sends.
        kind = req.kind.kind if req.kind.kind in _KNOWN_KINDS else "other"
        decisions.labels(webhook=webhook, kind=kind, allowed=str(allowed).lower()).inc()
        log.info(
            "admission_decided",
            webhook=webhook,
            kind=req.kind.kind,
            version=req.kind.version,
            name=req.name,
            operation=req.operation,
            uid=req.uid,
            dry_run=req.dry_run,
            allowed=allowed,
            **details,
        )

    async def validate(request: Request) -> Response:
        checked = await anyio.to_thread.run_sync(_validated, request.body, policy, limiter=checking)
        if isinstance(checked, Response):
            return checked
        req, errors = checked
        if not errors:
            record("validating", req, allowed=True)
            return _answer(AdmissionResponse(uid=req.uid, allowed=True))
        message = denial_message(errors)
        record("validating", req, allowed=False, reason=clip(message, LOGGED_REASON_CHARS))
        status = StatusResult(code=_INVALID, reason="Invalid", message=message)
        return _answer(AdmissionResponse(uid=req.uid, allowed=False, status=status))

    async def mutate(request: Request) -> Response:
        defaulted = await anyio.to_thread.run_sync(_defaulted, request.body, limiter=checking)
        if isinstance(defaulted, Response):
            return defaulted
        req, ops = defaulted
        record("mutating", req, allowed=True, patched=[op.path for op in ops[:_LOGGED_PATCHES]], patches=len(ops))
        if not ops:
            return _answer(AdmissionResponse(uid=req.uid, allowed=True))
        return _answer(AdmissionResponse(uid=req.uid, allowed=True, patch_type="JSONPatch", patch=_ENCODER.encode(ops)))

    return (HttpRoute("POST", VALIDATE_PATH, validate), HttpRoute("POST", MUTATE_PATH, mutate))


def _errors(req: AdmissionRequest, policy: AdmissionPolicy) -> tuple[FieldError, ...]:
    """What the rules of the request's group find wrong with its object."""
    if req.sub_resource:
        return ()  # status and other subresources are not the user's to validate
    if req.kind.group == diagnosis.GROUP:
        namespace, max_targets = req.namespace, policy.diagnosis_max_targets
        if req.operation == "CREATE":
            return diagnosis_validation.validate_create(req.object, namespace=namespace, max_targets=max_targets)
        if req.operation == "UPDATE":
            return diagnosis_validation.validate_update(
                req.object, req.old_object, namespace=namespace, max_targets=max_targets
            )
    elif req.operation == "CREATE":
        return validate_create(req.object, policy=policy)
    elif req.operation == "UPDATE":
        return validate_update(req.object, req.old_object, policy=policy)
    return ()  # DELETE and CONNECT are not registered; admit them if they come anyway


def _defaults(req: AdmissionRequest) -> tuple[PatchOperation, ...]:
    if req.kind.group == diagnosis.GROUP:
        return diagnosis_validation.default_patch(req.object)
    return default_patch(req.object)
