"""The admission webhook configurations: what they send to the controller, and registering them.

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

from roles.controller.admission.reviews import MUTATE_PATH, VALIDATE_PATH
from roles.kube import ApiError, Conflict, Kube, NotFound, Resource
from schemas.diagnosis import v1 as diagnosis
from schemas.diagnosis.kinds import DIAGNOSIS_KINDS, DIAGNOSIS_TASK
from schemas.kinds import GROUP, KINDS
from schemas.meta import ApiStruct, LabelSelector, ObjectMeta

__all__ = [
    "CONFIGURATION_NAME",
    "MUTATING_WEBHOOKS",
    "VALIDATING_WEBHOOKS",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
    "register_webhooks",
    "webhook_configurations",
]

Log = structlog.typing.FilteringBoundLogger

VALIDATING_WEBHOOK_NAME: Final = "validate.nodetask.kubeedge.io"
MUTATING_WEBHOOK_NAME: Final = "mutate.nodetask.kubeedge.io"
CONFIGURATION_NAME: Final = "nodetaskd"
"""The name of both webhook configurations: the only ones the controller's RBAC lets it patch."""
_FORBIDDEN: Final = 403


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
