"""Admission rules for node jobs: validation and defaulting of the raw JSON object.

Pure and backend-neutral, so the webhook (``roles/controller/admission/reviews.py``) and any other caller
apply one set of rules. The rules work on the object as the API server sends it (decoded JSON, not
a Struct) so that a field of the wrong type becomes a :class:`FieldError` naming its path instead of
a decode failure that hides every other mistake. Once the rules pass, the object is also converted
to its msgspec type, which catches the remaining type errors with the same path format.

Beyond KubeEdge (whose webhook checks only v1alpha1 NodeUpgradeJobs): every kind in every served
version is checked, ``failureTolerate``, ``concurrency`` and ``timeoutSeconds`` are bounded, images
and ``updateFields`` must be non-empty, and an UPDATE that keeps the spec is admitted without
re-checking it, so an object stored before the webhook existed can still lose its finalizer. Updates
(:mod:`schemas.job_updates`) and retries (:mod:`schemas.retry`): a Failure job may tune how it runs
before a retry, each other spec change is refused naming its field, and a new retry annotation value
is refused unless the job has finished with nodes to retry.

What the deployment allows beyond the schemas comes in as an :class:`AdmissionPolicy`, closed by
default: which ``updateFields`` keys a ConfigUpdateJob may set (the edge configuration's allowlist,
whose values are also converted to the edge configuration's type as the agent converts them), and
which namespaces an ImagePrePullJob's ``imageSecrets`` may name.

At most :data:`MAX_ERRORS` errors are named for one object, and checking stops at the next one:
an object of a million bad list entries costs the checks as much as one of twenty-one, and its
answer says there is more instead of listing it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from nodetask import image_reference
from schemas.access import DEFAULT_CONCURRENCY, DEFAULT_TIMEOUT_SECONDS
from schemas.checker import (
    MSGSPEC_PATH,
    Checker,
    FieldError,
    PatchOperation,
    json_type,
    type_errors,
    without_nulls,
)
from schemas.diagnosis.v1 import DEFAULT_MAX_TARGETS
from schemas.kinds import CONFIG_UPDATE_JOB, IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB, Kind
from schemas.kubelet_fields import kubelet_field_problem, kubelet_value
from schemas.manifest import ManifestError, kind_of
from schemas.meta import parse_tolerance
from schemas.update_fields import key_problem, shown_key, typed_value
from schemas.version_rule import MAX_REFERENCE_LENGTH, is_version

__all__ = [
    "CLOSED_POLICY",
    "AdmissionPolicy",
    "default_patch",
    "is_image_reference",
    "is_upgrade_image",
    "is_version",
    "validate_create",
]

NEITHER_SELECTOR_MESSAGE: Final = "both NodeNames and LabelSelector are NOT specified"
BOTH_SELECTORS_MESSAGE: Final = "both NodeNames and LabelSelector are specified"

# KubeEdge's pkg/util/validation regexes (its version rule is schemas.version_rule's). Go's \d is
# ASCII-only and its $ is the true end, hence [0-9], re.ASCII and fullmatch.
_UPGRADE_IMAGE: Final = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._:-]*/[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*"
    r"(@sha256:[A-Fa-f0-9]{64}|:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?",
    re.ASCII,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionPolicy:
    """What this deployment's settings allow beyond the job schemas; the defaults allow nothing."""

    updatable_edge_fields: frozenset[str] = frozenset()
    """``updateFields`` keys a ConfigUpdateJob may set (``roles.common.config.EdgeConfig.UPDATABLE_FIELDS``)."""
    edge_config: type[Any] | None = None
    """The edge configuration's type: the typed values must convert to it, as the agent converts them."""
    image_secret_namespaces: tuple[str, ...] = ()
    """Namespaces an ImagePrePullJob's ``imageSecrets`` may name (the hubs read Secrets nowhere else)."""
    diagnosis_max_targets: int = DEFAULT_MAX_TARGETS
    """Node names or pod references a Diagnosis may list (the controller's ``diagnosisMaxTargets``)."""


CLOSED_POLICY: Final = AdmissionPolicy()


def is_upgrade_image(value: str) -> bool:
    """KubeEdge's upgrade-image format: a repository with at least one ``/``, an optional tag or digest."""
    return len(value) <= MAX_REFERENCE_LENGTH and _UPGRADE_IMAGE.fullmatch(value) is not None


def is_image_reference(value: str) -> bool:
    """A container image reference the CRI can pull (``busybox:latest``, ``ghcr.io/a/b@sha256:...``).

    Unlike KubeEdge's upgrade image (:func:`is_upgrade_image`), a bare ``busybox:latest`` is one, as in
    KubeEdge's own pre-pull sample.
    """
    return len(value) <= MAX_REFERENCE_LENGTH and image_reference.REFERENCE.fullmatch(value) is not None


def _check_tolerance(c: Checker, obj: Mapping[str, Any], path: str) -> None:
    text = c.typed(obj, "failureTolerate", path, str, 'a decimal string such as "0.1"')
    if text is None:
        return
    try:
        # The same rule the API types apply, so admitted objects always decode.
        parse_tolerance(text)
    except ValueError:
        c.fail(f"{path}.failureTolerate", f"must be a decimal number within [0, 1], got {text!r}")


def _check_selectors(c: Checker, obj: Mapping[str, Any], path: str) -> None:
    names = c.typed(obj, "nodeNames", path, list, "an array of node names")
    selector = c.typed(obj, "labelSelector", path, dict, "a label selector object")
    if (obj.get("nodeNames") is not None and names is None) or (
        obj.get("labelSelector") is not None and selector is None
    ):
        return  # a wrong type, already reported
    for i, name in enumerate(names or ()):
        if not isinstance(name, str) or not name:
            c.fail(f"{path}.nodeNames[{i}]", f"must be a non-empty node name, got {name!r}")
    # KubeEdge's rule: an empty list means "not specified", an empty selector object does not.
    if not names and selector is None:
        c.fail(f"{path}.nodeNames", f"{NEITHER_SELECTOR_MESSAGE} (set exactly one of nodeNames, labelSelector)")
    elif names and selector is not None:
        c.fail(f"{path}.nodeNames", f"{BOTH_SELECTORS_MESSAGE} (set exactly one of nodeNames, labelSelector)")


def _check_execution(c: Checker, obj: Mapping[str, Any], path: str) -> None:
    """The limits every kind has: concurrency, timeoutSeconds, failureTolerate."""
    c.check_range(obj, "concurrency", path, 1, 2**31 - 1)
    c.check_range(obj, "timeoutSeconds", path, 1, 2**32 - 1)
    _check_tolerance(c, obj, path)


def _check_upgrade(c: Checker, spec: Mapping[str, Any], policy: AdmissionPolicy) -> None:
    version = c.typed(spec, "version", "spec", str, "a string")
    if spec.get("version") is None or version == "":
        c.fail("spec.version", "is required, e.g. v1.21.0")
    elif version is not None and not is_version(version):
        c.fail("spec.version", f"must look like v1.21.0 or v1.21.0-beta.1, got {version!r}")
    image = c.typed(spec, "image", "spec", str, "a string")
    # Empty means the default installation-package image.
    if image and not is_upgrade_image(image):
        c.fail("spec.image", f"must be an image repository such as kubeedge/installation-package, got {image!r}")
    _check_selectors(c, spec, "spec")
    _check_execution(c, spec, "spec")


def _check_prepull(c: Checker, spec: Mapping[str, Any], policy: AdmissionPolicy) -> None:
    path = "spec.imagePrePullTemplate"
    template = c.typed(spec, "imagePrePullTemplate", "spec", dict, "an object")
    if template is None:
        if spec.get("imagePrePullTemplate") is None:
            c.fail(path, "is required")
        return
    images = c.typed(template, "images", path, list, "an array of image references")
    if template.get("images") is None or images == []:
        c.fail(f"{path}.images", "must list at least one image")
    for i, image in enumerate(images or ()):
        if not isinstance(image, str) or not is_image_reference(image):
            c.fail(f"{path}.images[{i}]", f"must be an image reference such as busybox:latest, got {image!r}")
    secret = c.typed(template, "imageSecrets", path, str, "a string")
    if secret:
        namespace, _, name = secret.partition("/")
        if not namespace or not name or "/" in name:
            c.fail(f"{path}.imageSecrets", f"must be namespace/name of a Secret, got {shown_key(secret)}")
        elif namespace not in policy.image_secret_namespaces:
            allowed = ", ".join(policy.image_secret_namespaces) or "no namespace"
            c.fail(
                f"{path}.imageSecrets",
                f"namespace {shown_key(namespace)} is not one the hubs read image secrets from: only {allowed}"
                " (the controller's and the hubs' imageSecretNamespaces setting)",
            )
    c.check_range(template, "retryTimes", path, 0, 2**31 - 1)
    _check_selectors(c, template, path)
    _check_execution(c, template, path)


def _check_config_update(c: Checker, spec: Mapping[str, Any], policy: AdmissionPolicy) -> None:
    fields = c.typed(spec, "updateFields", "spec", dict, "an object of field paths to values")
    if spec.get("updateFields") is None or fields == {}:
        c.fail("spec.updateFields", "must set at least one field")
    if spec.get("component") == "kubelet":
        _check_kubelet_fields(c, fields or {})
        _check_selectors(c, spec, "spec")
        _check_execution(c, spec, "spec")
        return
    typed: dict[str, object] = {}
    for key, value in (fields or {}).items():
        path = f"spec.updateFields[{shown_key(key)}]" if key else "spec.updateFields"
        if problem := key_problem(key, policy.updatable_edge_fields):
            c.fail(path, problem)
        elif not isinstance(value, str):
            c.fail(path, f"must be a string, got {json_type(value)}")
        else:
            typed[key] = typed_value(value)
    if typed and policy.edge_config is not None:
        _check_edge_values(c, typed, policy.edge_config)
    _check_selectors(c, spec, "spec")
    _check_execution(c, spec, "spec")


def _check_kubelet_fields(c: Checker, fields: Mapping[str, Any]) -> None:
    """The kubelet's allowed fields, each value of its KubeletConfiguration type."""
    for key, value in fields.items():
        path = f"spec.updateFields[{shown_key(key)}]" if key else "spec.updateFields"
        if problem := kubelet_field_problem(key):
            c.fail(path, problem)
        elif not isinstance(value, str):
            c.fail(path, f"must be a string, got {json_type(value)}")
        elif (problem := kubelet_value(key, value)[1]) != "":
            c.fail(path, problem)


def _check_edge_values(c: Checker, typed: Mapping[str, object], edge_config: type[Any]) -> None:
    """The updated values convert to the edge configuration, as they must on every edge."""
    try:
        # Every edge setting has a default, so the updated ones alone make a whole configuration.
        msgspec.convert(typed, type=edge_config)
    except msgspec.ValidationError as exc:
        match = MSGSPEC_PATH.fullmatch(str(exc))
        if match is None:  # a setting's own rule (e.g. logLevel's names) says which setting it is
            c.fail("spec.updateFields", str(exc))
        else:  # an allowed key, hence short
            c.fail(f"spec.updateFields[{match['path']!r}]", match["message"])


_CHECKS: Final = {
    NODE_UPGRADE_JOB.kind: _check_upgrade,
    IMAGE_PRE_PULL_JOB.kind: _check_prepull,
    CONFIG_UPDATE_JOB.kind: _check_config_update,
}


def _identify(c: Checker, obj: Mapping[str, Any]) -> tuple[Kind, str] | None:
    api_version = c.typed(obj, "apiVersion", "", str, "a string")
    kind = c.typed(obj, "kind", "", str, "a string")
    if api_version is None or kind is None:
        if obj.get("apiVersion") is None:
            c.fail("apiVersion", "is required")
        if obj.get("kind") is None:
            c.fail("kind", "is required")
        return None
    try:
        return kind_of(api_version, kind)
    except ManifestError as exc:
        # A known kind in the wrong group or at an unserved version is the apiVersion's fault.
        c.fail("apiVersion" if kind in _CHECKS else "kind", str(exc))
        return None


def validate_create(obj: object, *, policy: AdmissionPolicy = CLOSED_POLICY) -> tuple[FieldError, ...]:
    """The broken rules of a node job of any served kind and version; empty when it is valid.

    At most :data:`MAX_ERRORS`, then :data:`STOPPED` if there were more. Never raises: any JSON value
    is a valid input, and garbage yields errors naming its fields. ``policy`` says what the
    deployment allows (by default: no config update keys).
    """
    return Checker().run(_check_object, obj, policy)


def _check_object(c: Checker, obj: object, policy: AdmissionPolicy) -> None:
    if not isinstance(obj, dict):
        c.fail("(object)", f"must be an object, got {json_type(obj)}")
        return
    identity = _identify(c, obj)
    if identity is None:
        return
    kind, version = identity
    spec = c.typed(obj, "spec", "", dict, "an object")
    if spec is None:
        if obj.get("spec") is None:
            c.fail("spec", "is required")
        return
    _CHECKS[kind.kind](c, spec, policy)
    if not c.errors:
        # The API server prunes nulls of non-nullable fields before admission; do the same here so
        # that null keeps meaning absent, as it does in the rules above.
        c.errors.extend(type_errors(without_nulls(obj), kind.versions[version]))


def default_patch(obj: object) -> tuple[PatchOperation, ...]:
    """JSON Patch operations that set the documented defaults where they are absent.

    ``concurrency`` 1 and ``timeoutSeconds`` 300 (KubeEdge's mutating webhook, extended to every kind;
    ImagePrePullJob's live under ``spec/imagePrePullTemplate``). Only absent or null fields are
    set: an explicit ``0`` is left for validation to reject rather than silently rewritten. Objects
    too malformed to locate the fields get no patch; validation reports them.
    """
    if not isinstance(obj, dict) or not isinstance(spec := obj.get("spec"), dict):
        return ()
    pointer = "/spec"
    if obj.get("kind") == IMAGE_PRE_PULL_JOB.kind:
        spec = spec.get("imagePrePullTemplate")
        pointer = "/spec/imagePrePullTemplate"
        if not isinstance(spec, dict):
            return ()
    ops = []
    if spec.get("concurrency") is None:
        ops.append(PatchOperation(op="add", path=f"{pointer}/concurrency", value=DEFAULT_CONCURRENCY))
    if spec.get("timeoutSeconds") is None:
        ops.append(PatchOperation(op="add", path=f"{pointer}/timeoutSeconds", value=DEFAULT_TIMEOUT_SECONDS))
    return tuple(ops)
