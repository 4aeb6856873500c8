"""The controller's admission webhooks for node jobs and the diagnosis kinds: validating and defaulting.

``POST /validate`` (:data:`VALIDATE_PATH`) admits a job only if it follows ``schemas.validation``,
and an Operation, OperationSet, Diagnosis or Task only if it follows
``schemas.diagnosis_validation``; ``POST /mutate`` (:data:`MUTATE_PATH`) answers with a JSON Patch
that sets the defaults (a job's ``concurrency`` and ``timeoutSeconds``; an Operation's timeout,
scheme and path, an OperationSet's node ids, a Diagnosis's ``stagePolicy``). Tasks are not sent to
the mutating webhook: they have no defaults, and the controller creates one per node and stage.
Both take and give ``admission.k8s.io/v1`` AdmissionReviews; a body that is not one gets 400 with
the reason, as does one nested deeper than ``nesting.MAX_DEPTH`` (the rules walk the object
recursively).

Failure policies (see :func:`webhook_configurations`): validating is ``Fail``, so an invalid job is
never stored while the controller is down (creation waits for it instead); mutating is ``Ignore``
because its defaults are conveniences: the controller and hubs apply the same defaults when the
fields are absent (``schemas.access.Targeting``, the diagnosis types' own defaults), so an object
stored without them behaves the same. Both cover CREATE and UPDATE of every kind at every served
version (Tasks: validating only), not the ``status`` subresource
(which the controller and hubs write and the webhooks must never slow down).
"""

from __future__ import annotations

from typing import Any, Final, TypeVar

import msgspec
import structlog
from prometheus_client import CollectorRegistry, Counter

from nodetask import nesting
from roles.config import ControllerConfig, EdgeConfig
from roles.http import Request, Response, Route
from roles.kube import ApiError, Conflict, Kube, NotFound, Resource
from schemas import diagnosis, diagnosis_validation
from schemas.diagnosis_kinds import DIAGNOSIS_KINDS, DIAGNOSIS_TASK
from schemas.kinds import GROUP, KINDS
from schemas.meta import ApiStruct, LabelSelector, ObjectMeta
from schemas.validation import (
    AdmissionPolicy,
    FieldError,
    PatchOperation,
    default_patch,
    validate_create,
    validate_update,
)

__all__ = [
    "CONFIGURATION_NAME",
    "MUTATE_PATH",
    "MUTATING_WEBHOOKS",
    "VALIDATE_PATH",
    "VALIDATING_WEBHOOKS",
    "AdmissionRequest",
    "AdmissionResponse",
    "AdmissionReview",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "admission_policy",
    "admission_routes",
    "register_webhooks",
    "webhook_configurations",
]

Log = structlog.typing.FilteringBoundLogger

VALIDATE_PATH: Final = "/validate"
MUTATE_PATH: Final = "/mutate"
ADMISSION_API_VERSION: Final = "admission.k8s.io/v1"
VALIDATING_WEBHOOK_NAME: Final = "validate.nodetask.kubeedge.io"
MUTATING_WEBHOOK_NAME: Final = "mutate.nodetask.kubeedge.io"
CONFIGURATION_NAME: Final = "nodetaskd"
"""The name of both webhook configurations: the only ones the controller's RBAC lets it patch."""

_INVALID: Final = 422
"""The HTTP status the API server answers a denied request with (``kubectl`` shows the message)."""
_FORBIDDEN: Final = 403


# ---------------------------------------------------------------------------------------------- review


class GroupVersionKind(msgspec.Struct, frozen=True, kw_only=True):
    group: str = ""
    version: str = ""
    kind: str = ""


class AdmissionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The fields of an ``AdmissionRequest`` used here; objects stay raw JSON for the rules."""

    uid: str
    kind: GroupVersionKind
    operation: str
    name: str = ""
    sub_resource: str = ""
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


def _read_review(request: Request) -> AdmissionRequest | Response:
    """The review's request, or the 400 response that says why there is none."""
    try:
        nesting.check_json(request.body)
        review = _REVIEW_DECODER.decode(request.body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return Response.text(400, f"not an AdmissionReview: {exc}")
    if review.api_version != ADMISSION_API_VERSION or review.kind != "AdmissionReview":
        return Response.text(
            400, f"expected {ADMISSION_API_VERSION} AdmissionReview, got {review.api_version} {review.kind}"
        )
    if review.request is None:
        return Response.text(400, "the AdmissionReview has no request")
    return review.request


def _answer(response: AdmissionResponse) -> Response:
    review = AdmissionReview(api_version=ADMISSION_API_VERSION, kind="AdmissionReview", response=response)
    return Response.json(200, _ENCODER.encode(review))


def admission_policy(cfg: ControllerConfig) -> AdmissionPolicy:
    """What the webhook admits beyond the job schemas: the edge configuration's updatable settings, and
    image secrets from the namespaces ``cfg`` allows."""
    return AdmissionPolicy(
        updatable_edge_fields=EdgeConfig.UPDATABLE_FIELDS,
        edge_config=EdgeConfig,
        image_secret_namespaces=cfg.image_secret_namespaces,
    )


def admission_routes(*, policy: AdmissionPolicy, registry: CollectorRegistry, log: Log) -> tuple[Route, ...]:
    """The two webhook routes, admitting what ``policy`` allows and counting decisions in ``registry``.

    The counter ``nodetaskd_controller_admission_decisions_total`` has labels ``webhook`` (validating,
    mutating), ``kind`` (the job or diagnosis kind, ``other`` for anything else) and ``allowed``.
    """
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
        req = _read_review(request)
        if isinstance(req, Response):
            return req
        errors = _errors(req, policy)
        if not errors:
            record("validating", req, allowed=True)
            return _answer(AdmissionResponse(uid=req.uid, allowed=True))
        message = "; ".join(str(e) for e in errors)
        record("validating", req, allowed=False, reason=message)
        status = StatusResult(code=_INVALID, reason="Invalid", message=message)
        return _answer(AdmissionResponse(uid=req.uid, allowed=False, status=status))

    async def mutate(request: Request) -> Response:
        req = _read_review(request)
        if isinstance(req, Response):
            return req
        # UPDATE too: a replace that leaves the defaults out gets them back, so its spec still equals
        # the stored one and passes the immutability rule.
        wanted = req.operation in ("CREATE", "UPDATE") and not req.sub_resource
        ops = _defaults(req) if wanted else ()
        record("mutating", req, allowed=True, patched=[op.path for op in ops])
        if not ops:
            return _answer(AdmissionResponse(uid=req.uid, allowed=True))
        return _answer(AdmissionResponse(uid=req.uid, allowed=True, patch_type="JSONPatch", patch=_ENCODER.encode(ops)))

    return (Route("POST", VALIDATE_PATH, validate), Route("POST", MUTATE_PATH, mutate))


def _errors(req: AdmissionRequest, policy: AdmissionPolicy) -> tuple[FieldError, ...]:
    """What the rules of the request's group find wrong with its object."""
    if req.sub_resource:
        return ()  # status and other subresources are not the user's to validate
    if req.kind.group == diagnosis.GROUP:
        if req.operation == "CREATE":
            return diagnosis_validation.validate_create(req.object)
        if req.operation == "UPDATE":
            return diagnosis_validation.validate_update(req.object, req.old_object)
    elif req.operation == "CREATE":
        return validate_create(req.object, policy=policy)
    elif req.operation == "UPDATE":
        return validate_update(req.object, req.old_object, policy=policy)
    return ()  # DELETE and CONNECT are not registered; admit them if they come anyway


def _defaults(req: AdmissionRequest) -> tuple[PatchOperation, ...]:
    if req.kind.group == diagnosis.GROUP:
        return diagnosis_validation.default_patch(req.object)
    return default_patch(req.object)


# ---------------------------------------------------------------------------------------------- configuration


class ServiceReference(ApiStruct, frozen=True):
    """The Service the API server calls a webhook through (``clientConfig.service``)."""

    namespace: str
    name: str
    path: str
    port: int = 443


class WebhookClientConfig(ApiStruct, frozen=True):
    ca_bundle: bytes
    """PEM of the CA that signed the serving certificate; base64 on the wire, as msgspec encodes bytes."""
    url: str | None = None
    service: ServiceReference | None = None
    """Exactly one of ``url`` and ``service`` is set."""


class RuleWithOperations(ApiStruct, frozen=True):
    api_groups: tuple[str, ...]
    api_versions: tuple[str, ...]
    resources: tuple[str, ...]
    operations: tuple[str, ...]
    scope: str = "*"


class ValidatingWebhook(ApiStruct, frozen=True):
    # Fields without defaults are always encoded: v1 requires sideEffects and admissionReviewVersions.
    name: str
    client_config: WebhookClientConfig
    rules: tuple[RuleWithOperations, ...]
    failure_policy: str
    match_policy: str
    side_effects: str
    admission_review_versions: tuple[str, ...]
    timeout_seconds: int
    object_selector: LabelSelector | None = None


class MutatingWebhook(ValidatingWebhook, frozen=True):
    reinvocation_policy: str = "Never"


class ValidatingWebhookConfiguration(ApiStruct, frozen=True):
    api_version: str
    kind: str
    metadata: ObjectMeta
    webhooks: tuple[ValidatingWebhook, ...] = ()


class MutatingWebhookConfiguration(ApiStruct, frozen=True):
    api_version: str
    kind: str
    metadata: ObjectMeta
    webhooks: tuple[MutatingWebhook, ...] = ()


_Config = TypeVar("_Config", ValidatingWebhookConfiguration, MutatingWebhookConfiguration)

_ADMISSION_REGISTRATION: Final = "admissionregistration.k8s.io/v1"
VALIDATING_WEBHOOKS: Final = Resource(
    _ADMISSION_REGISTRATION, "validatingwebhookconfigurations", ValidatingWebhookConfiguration
)
MUTATING_WEBHOOKS: Final = Resource(
    _ADMISSION_REGISTRATION, "mutatingwebhookconfigurations", MutatingWebhookConfiguration
)


def webhook_configurations(
    *,
    ca_bundle: bytes,
    url_base: str = "",
    service: tuple[str, str, int] | None = None,
    name: str = CONFIGURATION_NAME,
    timeout_seconds: int = 5,
    object_selector: LabelSelector | None = None,
) -> tuple[ValidatingWebhookConfiguration, MutatingWebhookConfiguration]:
    """The configurations that send every node job's and diagnosis object's CREATE and UPDATE to the
    controller, at ``url_base`` or through ``service``.

    ``url_base`` is ``https://host:port`` of :func:`admission_routes`' server, for a controller outside
    the cluster (as in the tests); ``service`` is (namespace, name, port) of the Service in front of
    the controller's replicas in the cluster (``containers/deploy/``). ``object_selector`` limits the
    webhooks to labelled jobs (e.g. for a staged roll-out).

    Errors: :class:`ValueError` unless exactly one of ``url_base`` and ``service`` is given.
    """
    if bool(url_base) == (service is not None):
        raise ValueError("the webhooks need exactly one of url_base and service")
    job_rules = tuple(
        RuleWithOperations(
            api_groups=(GROUP,),
            api_versions=tuple(kind.versions),
            resources=(kind.plural,),
            operations=("CREATE", "UPDATE"),
            scope="Cluster",
        )
        for kind in KINDS
    )

    def diagnosis_rule(kinds: tuple[Any, ...]) -> RuleWithOperations:
        return RuleWithOperations(
            api_groups=(diagnosis.GROUP,),
            api_versions=(diagnosis.VERSION,),
            resources=tuple(kind.plural for kind in kinds),
            operations=("CREATE", "UPDATE"),
            scope="*",  # Operations and OperationSets are cluster-scoped, Diagnoses and Tasks namespaced
        )

    defaulted = tuple(kind for kind in DIAGNOSIS_KINDS if kind is not DIAGNOSIS_TASK)
    common: dict[str, Any] = {
        # Equivalent: should a newer version be served before this list knows it, its requests are
        # converted to a listed version and still checked.
        "match_policy": "Equivalent",
        "side_effects": "None",
        "admission_review_versions": ("v1",),
        "timeout_seconds": timeout_seconds,
        "object_selector": object_selector,
    }
    base = url_base.rstrip("/")

    def client_config(path: str) -> WebhookClientConfig:
        if service is None:
            return WebhookClientConfig(url=f"{base}{path}", ca_bundle=ca_bundle)
        namespace, service_name, port = service
        reference = ServiceReference(namespace=namespace, name=service_name, path=path, port=port)
        return WebhookClientConfig(service=reference, ca_bundle=ca_bundle)

    validating = ValidatingWebhookConfiguration(
        api_version=_ADMISSION_REGISTRATION,
        kind="ValidatingWebhookConfiguration",
        metadata=ObjectMeta(name=name),
        webhooks=(
            ValidatingWebhook(
                name=VALIDATING_WEBHOOK_NAME,
                client_config=client_config(VALIDATE_PATH),
                rules=(*job_rules, diagnosis_rule(DIAGNOSIS_KINDS)),
                failure_policy="Fail",
                **common,
            ),
        ),
    )
    mutating = MutatingWebhookConfiguration(
        api_version=_ADMISSION_REGISTRATION,
        kind="MutatingWebhookConfiguration",
        metadata=ObjectMeta(name=name),
        webhooks=(
            MutatingWebhook(
                name=MUTATING_WEBHOOK_NAME,
                client_config=client_config(MUTATE_PATH),
                rules=(*job_rules, diagnosis_rule(defaulted)),
                failure_policy="Ignore",
                reinvocation_policy="Never",
                **common,
            ),
        ),
    )
    return validating, mutating


async def register_webhooks(
    kube: Kube, validating: ValidatingWebhookConfiguration, mutating: MutatingWebhookConfiguration, *, log: Log
) -> None:
    """Bring both configurations up to date (a new URL or CA bundle), creating those that do not exist.

    An existing configuration's ``webhooks`` list is replaced whole by a merge patch, so webhooks
    added to it by hand are dropped: the configuration is owned by nodetaskd. Patching comes first:
    the controller's RBAC lets it patch its own two configurations only, and create none unless
    ``containers/rbac/webhook-registration`` is bound (Kubernetes cannot limit create to a name);
    ``containers/deploy`` ships them instead.

    Errors: the :class:`~roles.kube.ApiError` of a refused write, after an error log saying what to do
    when a missing configuration may not be created.
    """
    await _update_or_create(kube, VALIDATING_WEBHOOKS, validating, log=log)
    await _update_or_create(kube, MUTATING_WEBHOOKS, mutating, log=log)


async def _update_or_create(kube: Kube, resource: Resource[_Config], config: _Config, *, log: Log) -> None:
    name = config.metadata.name
    log = log.bind(resource=resource.plural, name=name)
    patch = {"webhooks": msgspec.to_builtins(config.webhooks)}
    try:
        await kube.merge_patch(resource, name, patch)
    except NotFound:
        pass
    else:
        log.info("webhook_configuration_updated")
        return
    try:
        await kube.create(resource, config)
    except Conflict:
        # Another replica created it meanwhile: bring it up to date all the same.
        await kube.merge_patch(resource, name, patch)
        log.info("webhook_configuration_updated")
        return
    except ApiError as exc:
        if exc.status == _FORBIDDEN:
            log.error(
                "webhook_configuration_missing",
                error=str(exc),
                fix="apply containers/deploy/webhooks.yaml, or bind containers/rbac/webhook-registration",
            )
        raise
    log.info("webhook_configuration_created")
