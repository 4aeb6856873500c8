"""Admission rules for every kind and version, the defaults patch, and the webhook handlers around them."""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

import msgspec
import prometheus_client
import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st
from structlog.testing import capture_logs

from roles.common.config import ControllerConfig
from roles.common.health import Request, Response, router
from roles.controller.admission.reviews import (
    ERROR_CHARS,
    LOGGED_REASON_CHARS,
    MUTATE_PATH,
    VALIDATE_PATH,
    admission_policy,
    admission_routes,
)
from schemas.checker import MAX_ERRORS, STOPPED, FieldError
from schemas.job_updates import IMMUTABLE_SPEC_MESSAGE, validate_update
from schemas.manifest import decode_job
from schemas.validation import (
    default_patch,
    is_image_reference,
    is_upgrade_image,
    is_version,
    validate_create,
)


def without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


DATA = Path(__file__).resolve().parents[2] / "data"
V1 = "operations.kubeedge.io/v1alpha1"
V2 = "operations.kubeedge.io/v1alpha2"


def upgrade(api_version: str = V2, **spec: Any) -> dict[str, Any]:
    base = {"version": "v1.21.0", "image": "kubeedge/installation-package", "nodeNames": ["edge-1"]}
    return {"apiVersion": api_version, "kind": "NodeUpgradeJob", "metadata": {"name": "j"}, "spec": base | spec}


def prepull(api_version: str = V2, **template: Any) -> dict[str, Any]:
    base = {"images": ["busybox:latest"], "nodeNames": ["edge-1"]}
    spec = {"imagePrePullTemplate": base | template}
    return {"apiVersion": api_version, "kind": "ImagePrePullJob", "metadata": {"name": "j"}, "spec": spec}


POLICY = admission_policy(ControllerConfig())
"""What a controller with the default configuration admits."""


def config_update(**spec: Any) -> dict[str, Any]:
    base = {"updateFields": {"logLevel": "debug"}, "labelSelector": {"matchLabels": {"a": "b"}}}
    return {"apiVersion": V2, "kind": "ConfigUpdateJob", "metadata": {"name": "j"}, "spec": base | spec}


def paths(errors: tuple[FieldError, ...]) -> list[str]:
    return [e.path for e in errors]


# ---------------------------------------------------------------------------------------------- valid jobs


@pytest.mark.parametrize(
    "job",
    [upgrade(), upgrade(V1), prepull(), prepull(V1), config_update()],
    ids=["upgrade-v2", "upgrade-v1", "prepull-v2", "prepull-v1", "configupdate-v2"],
)
def test_valid_job_of_each_kind_and_version_is_accepted(job: dict[str, Any]) -> None:
    """A minimal valid job of every kind at every served version has no errors."""
    assert validate_create(job, policy=POLICY) == ()


@pytest.mark.parametrize("sample", ["kubeedge-nodeupgradejob-v1alpha1.yaml", "kubeedge-imageprepulljob-v1alpha1.yaml"])
def test_kubeedge_samples_are_accepted(sample: str) -> None:
    """KubeEdge's own samples pass, pruned extra fields and a slash-less pre-pull image included."""
    assert validate_create(msgspec.yaml.decode((DATA / sample).read_bytes())) == ()


def test_full_upgrade_spec_with_every_limit_set_is_accepted() -> None:
    """Every optional field set to a boundary value passes."""
    job = upgrade(
        concurrency=1,
        timeoutSeconds=1,
        failureTolerate="1",
        checkItems=["cpu"],
        requireConfirmation=True,
        image="registry.local:5000/kubeedge/installation-package:v1.21.0",
        imageDigestGatter={"amd64": "sha256:" + "a" * 64},
    )
    assert validate_create(job) == ()


# ---------------------------------------------------------------------------------------------- formats


@given(
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.integers(0, 10**6),
    st.lists(st.from_regex(r"[a-zA-Z0-9_.]{1,8}", fullmatch=True), max_size=3),
)
def test_kubeedge_versions_are_accepted(major: int, minor: int, patch: int, suffix: list[str]) -> None:
    """vX.Y.Z with optional dash-separated pre-release parts matches KubeEdge's version regex."""
    version = f"v{major}.{minor}.{patch}" + "".join(f"-{s}" for s in suffix)
    assert is_version(version)
    assert validate_create(upgrade(version=version)) == ()


@pytest.mark.parametrize(
    "version", ["1.21.0", "v1.21", "v1.21.0-", "v1.21.0\n", "v1.2.3 ", "v١.2.3", "latest", "V1.2.3"]
)
def test_malformed_versions_are_rejected_at_spec_version(version: str) -> None:
    """Versions KubeEdge's regex refuses are errors at spec.version (Unicode digits and a final newline too)."""
    assert not is_version(version)
    errors = validate_create(upgrade(version=version))
    assert paths(errors) == ["spec.version"]
    assert repr(version) in errors[0].message


def test_missing_version_is_required() -> None:
    """An upgrade without a version is an error at spec.version."""
    job = upgrade()
    del job["spec"]["version"]
    assert paths(validate_create(job)) == ["spec.version"]


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("kubeedge/installation-package", True),
        ("docker.io/kubeedge/installation-package:v1.21.0", True),
        ("localhost:5000/a/b@sha256:" + "0" * 64, True),
        ("installation-package", False),
        ("kubeedge/", False),
        ("/kubeedge/x", False),
        ("kubeedge/x:", False),
        ("kubeedge/x y", False),
    ],
)
def test_upgrade_image_needs_a_repository_path(image: str, ok: bool) -> None:
    """The upgrade image follows KubeEdge's regex, which requires a '/'; failures name spec.image."""
    assert is_upgrade_image(image) is ok
    assert paths(validate_create(upgrade(image=image))) == ([] if ok else ["spec.image"])


def test_empty_upgrade_image_means_the_default() -> None:
    """An empty image is allowed: the default installation-package image applies."""
    assert validate_create(upgrade(image="")) == ()


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("busybox", True),
        ("busybox:latest", True),
        ("ghcr.io/org/app:1.0", True),
        ("[::1]:5000/app", True),
        ("app@sha256:" + "f" * 64, True),
        ("Busybox", False),
        ("busybox:", False),
        ("busy box", False),
        ("", False),
        ("a" * 2000, False),
    ],
)
def test_prepull_images_are_image_references(image: str, ok: bool) -> None:
    """Pre-pull images follow the container reference grammar; a bad one is named by its index."""
    assert is_image_reference(image) is ok
    errors = validate_create(prepull(images=["busybox", image]))
    assert paths(errors) == ([] if ok else ["spec.imagePrePullTemplate.images[1]"])


# ---------------------------------------------------------------------------------------------- rules


def test_neither_selector_is_kubeedges_error() -> None:
    """No nodeNames and no labelSelector: KubeEdge's exact text, at the field path."""
    errors = validate_create(upgrade(nodeNames=[]))
    assert paths(errors) == ["spec.nodeNames"]
    assert errors[0].message.startswith("both NodeNames and LabelSelector are NOT specified")


def test_both_selectors_is_kubeedges_error() -> None:
    """nodeNames and labelSelector together: KubeEdge's exact text, at the template's path."""
    errors = validate_create(prepull(labelSelector={"matchLabels": {"a": "b"}}))
    assert paths(errors) == ["spec.imagePrePullTemplate.nodeNames"]
    assert errors[0].message.startswith("both NodeNames and LabelSelector are specified")


def test_empty_selector_object_counts_as_specified() -> None:
    """As in KubeEdge, an empty labelSelector object is a selector (it selects every node)."""
    assert validate_create(config_update(labelSelector={}), policy=POLICY) == ()


def test_empty_node_name_is_rejected_by_index() -> None:
    """A blank entry in nodeNames is an error naming its index."""
    assert paths(validate_create(upgrade(nodeNames=["a", ""]))) == ["spec.nodeNames[1]"]


def test_empty_images_and_update_fields_are_rejected() -> None:
    """A pre-pull without images and a config update without fields do nothing: both are errors."""
    assert paths(validate_create(prepull(images=[]))) == ["spec.imagePrePullTemplate.images"]
    no_images = prepull()
    del no_images["spec"]["imagePrePullTemplate"]["images"]
    assert paths(validate_create(no_images)) == ["spec.imagePrePullTemplate.images"]
    assert paths(validate_create(config_update(updateFields={}), policy=POLICY)) == ["spec.updateFields"]
    assert paths(validate_create(config_update(updateFields={"logLevel": 1}), policy=POLICY)) == [
        "spec.updateFields['logLevel']"
    ]


@pytest.mark.parametrize("value", ["0", "0.0", "1", "1.0", "0.25", "1e-1"])
def test_failure_tolerate_within_bounds_is_accepted(value: str) -> None:
    """Decimal strings within [0, 1] are accepted for every kind."""
    assert validate_create(upgrade(failureTolerate=value)) == ()
    assert validate_create(prepull(failureTolerate=value)) == ()
    assert validate_create(config_update(failureTolerate=value), policy=POLICY) == ()


@pytest.mark.parametrize(
    "value", ["1.01", "-0.1", "NaN", "Infinity", "abc", "", " 0.5", "0.5\n", "\uff10.5", "0_5", "0.5 ", 0.5, True]
)
def test_failure_tolerate_outside_bounds_or_not_a_decimal_string_is_rejected(value: object) -> None:
    """Out of range, not a number, or not a string: an error at failureTolerate."""
    assert paths(validate_create(upgrade(failureTolerate=value))) == ["spec.failureTolerate"]
    assert paths(validate_create(prepull(failureTolerate=value))) == ["spec.imagePrePullTemplate.failureTolerate"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("concurrency", 0),
        ("concurrency", -1),
        ("concurrency", 2**31),
        ("concurrency", "2"),
        ("concurrency", 1.5),
        ("timeoutSeconds", 0),
        ("timeoutSeconds", 2**32),
        ("timeoutSeconds", False),
    ],
)
def test_limits_out_of_range_or_mistyped_are_rejected(field: str, value: object) -> None:
    """concurrency and timeoutSeconds must be integers >= 1 when set; the error names the field."""
    errors = validate_create(config_update(**{field: value}), policy=POLICY)
    assert paths(errors) == [f"spec.{field}"]


def test_absent_or_null_limits_are_accepted() -> None:
    """A missing or null concurrency/timeoutSeconds/failureTolerate is not an error (defaults apply)."""
    assert validate_create(upgrade(concurrency=None, timeoutSeconds=None, failureTolerate=None)) == ()


def test_several_errors_are_reported_together() -> None:
    """Every broken rule is reported, not only the first."""
    errors = validate_create(upgrade(version="x", image="y", concurrency=0, failureTolerate="2"))
    assert paths(errors) == ["spec.version", "spec.image", "spec.concurrency", "spec.failureTolerate"]


def test_checking_stops_after_the_first_errors_and_says_there_is_more() -> None:
    """A million bad node names yield the first MAX_ERRORS errors and a last one saying checking stopped."""
    errors = validate_create(upgrade(nodeNames=[""] * 1_000_000))
    assert paths(errors[:-1]) == [f"spec.nodeNames[{i}]" for i in range(MAX_ERRORS)]
    assert errors[-1] == STOPPED
    assert str(errors[-1]) == f"and more: checking stops after the first {MAX_ERRORS} errors"
    assert len(validate_create(upgrade(nodeNames=[""] * MAX_ERRORS))) == MAX_ERRORS  # exactly the cap: no remark


def test_an_update_changing_many_fields_names_the_first_and_counts_the_rest() -> None:
    """A spec of many changed fields is refused naming MAX_ERRORS of them and how many more there are."""
    old = upgrade()
    new = copy.deepcopy(old)
    new["spec"] |= {f"field{i:04}": i for i in range(1000)}
    errors = validate_update(new, old)
    assert len(errors) == MAX_ERRORS + 1
    assert all(IMMUTABLE_SPEC_MESSAGE in e.message for e in errors[:-1])
    assert str(errors[-1]) == f"and {1000 - MAX_ERRORS} more"


def test_type_errors_the_rules_do_not_cover_are_reported_with_their_path() -> None:
    """A mistyped field beyond the rules (checkItems, a bad selector operator) is named by path."""
    assert paths(validate_create(prepull(checkItems="disk"))) == ["spec.imagePrePullTemplate.checkItems"]
    selector = {"matchExpressions": [{"key": "a", "operator": "Near"}]}
    assert paths(validate_create(config_update(labelSelector=selector), policy=POLICY)) == ["spec.labelSelector"]


@pytest.mark.parametrize(
    ("job", "path"),
    [
        ({"apiVersion": V1, "kind": "ConfigUpdateJob", "spec": {}}, "apiVersion"),
        ({"apiVersion": "apps/v1", "kind": "NodeUpgradeJob", "spec": {}}, "apiVersion"),
        ({"apiVersion": V2, "kind": "Pod", "spec": {}}, "kind"),
        ({"kind": "NodeUpgradeJob", "spec": {}}, "apiVersion"),
        ({"apiVersion": V2, "kind": "NodeUpgradeJob"}, "spec"),
        ({"apiVersion": V2, "kind": "NodeUpgradeJob", "spec": []}, "spec"),
        ({"apiVersion": V2, "kind": "ImagePrePullJob", "spec": {}}, "spec.imagePrePullTemplate"),
        ([], "(object)"),
    ],
)
def test_objects_that_are_not_node_jobs_are_rejected_by_field(job: object, path: str) -> None:
    """A wrong kind, version or shape is one error naming where it is."""
    assert paths(validate_create(job)) == [path]


# ---------------------------------------------------------------------------------------------- garbage

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
SPEC_KEYS = (
    "version",
    "image",
    "nodeNames",
    "labelSelector",
    "concurrency",
    "timeoutSeconds",
    "failureTolerate",
    "checkItems",
    "images",
    "updateFields",
    "imageSecrets",
    "retryTimes",
    "imageDigestGatter",
    "imagePrePullTemplate",
)
specs = st.dictionaries(st.sampled_from(SPEC_KEYS), json_values, max_size=8)
jobs = st.fixed_dictionaries(
    {
        "apiVersion": st.sampled_from([V1, V2]),
        "kind": st.sampled_from(["NodeUpgradeJob", "ImagePrePullJob", "ConfigUpdateJob"]),
        "spec": specs | st.fixed_dictionaries({"imagePrePullTemplate": specs}),
    }
)


@given(json_values | jobs)
def test_garbage_yields_field_errors_and_never_raises(obj: object) -> None:
    """Any JSON value, or a job with random field values, gives FieldErrors with a path, never an exception."""
    errors = validate_create(obj)
    assert all(isinstance(e, FieldError) and e.path and e.message for e in errors)
    validate_update(obj, obj)
    default_patch(obj)


@given(jobs)
def test_accepted_jobs_decode_into_the_api_types(obj: dict[str, Any]) -> None:
    """Whatever the rules admit also decodes into the msgspec type the controller uses."""
    if not validate_create(obj):
        # Nulls dropped, as the API server prunes those of non-nullable fields before storing.
        decode_job(msgspec.json.encode(without_nulls(obj)))


# ---------------------------------------------------------------------------------------------- update


def test_spec_change_on_update_is_rejected_with_kubeedges_text() -> None:
    """Changing a spec field of a job that is not Failure is refused with KubeEdge's message, naming the field."""
    old = upgrade()
    new = upgrade(version="v1.22.0")
    errors = validate_update(new, old)
    assert paths(errors) == ["spec.version"]
    assert str(errors[0]).startswith("spec.version: spec fields are not allowed to update once it's created (")
    assert "the job is not initialised yet" in errors[0].message


def with_status(job: dict[str, Any], phase: str, *node_phases: str, **annotations: str) -> dict[str, Any]:
    entries = [{"nodeName": f"edge-{i}", "phase": p} for i, p in enumerate(node_phases)]
    job = copy.deepcopy(job) | {"status": {"phase": phase, "nodeStatus": entries}}
    if annotations:
        job["metadata"]["annotations"] = annotations
    return job


RETRY = "nodetask.kubeedge.io/retry"


@pytest.mark.parametrize(
    ("before", "after", "field"),
    [
        (prepull(concurrency=1), prepull(concurrency=3), None),
        (prepull(), prepull(imageSecrets="kube-system/regcred", retryTimes=2, checkItems=["disk"]), None),
        (upgrade(failureTolerate="0.1"), upgrade(failureTolerate="0.5", timeoutSeconds=60), None),
        (config_update(), config_update(concurrency=2), None),
        (prepull(), prepull(images=["busybox:1.36"]), "spec.imagePrePullTemplate.images"),
        (prepull(), prepull(nodeNames=["edge-2"]), "spec.imagePrePullTemplate.nodeNames"),
        (upgrade(), upgrade(version="v1.22.0"), "spec.version"),
        (upgrade(), upgrade(image="other/package"), "spec.image"),
        (upgrade(), upgrade(requireConfirmation=True), "spec.requireConfirmation"),
        (config_update(), config_update(updateFields={"logLevel": "info"}), "spec.updateFields"),
    ],
)
def test_a_failure_job_may_tune_its_execution_but_never_change_its_task(
    before: dict[str, Any], after: dict[str, Any], field: str | None
) -> None:
    """On a Failure job the fields a retry may tune change; what a node task is stays, refused naming the field."""
    old = with_status(before, "Failure", "Failure")
    new = with_status(after, "Failure", "Failure")
    errors = validate_update(new, old, policy=POLICY)
    if field is None:
        assert errors == ()
    else:
        assert paths(errors) == [field]
        assert errors[0].message.startswith(IMMUTABLE_SPEC_MESSAGE)
        assert "a different node task is a new job" in errors[0].message


@pytest.mark.parametrize("phase", ["Init", "InProgress", "Completed"])
def test_only_a_failure_job_may_tune_its_spec(phase: str) -> None:
    """A tunable field is still immutable while the job runs or once it completed, and the reason says so."""
    old = with_status(prepull(), phase, "Failure")
    [error] = validate_update(with_status(prepull(concurrency=5), phase, "Failure"), old, policy=POLICY)
    assert error.path == "spec.imagePrePullTemplate.concurrency"
    assert f"the job is {phase}; only a Failure job may change" in error.message


def test_a_tuned_spec_is_validated_whole() -> None:
    """A tunable field changed to an invalid value is refused as on creation."""
    old = with_status(prepull(), "Failure", "Failure")
    errors = validate_update(with_status(prepull(concurrency=0), "Failure", "Failure"), old, policy=POLICY)
    assert paths(errors) == ["spec.imagePrePullTemplate.concurrency"]


@pytest.mark.parametrize(
    ("phase", "nodes", "refusal"),
    [
        ("InProgress", ("Failure", "InProgress"), "the job is InProgress: only a finished job"),
        ("Init", ("Pending",), "the job is Init"),
        ("Completed", ("Successful",), "no node of the job failed or timed out: there is nothing to retry"),
        ("Failure", ("Failure", "Unknown"), None),
        ("Completed", ("Successful", "Unknown"), None),
    ],
)
def test_a_new_retry_value_is_admitted_only_on_a_finished_job_with_nodes_to_retry(
    phase: str, nodes: tuple[str, ...], refusal: str | None
) -> None:
    """The retry annotation's new value is refused, with the reason, unless the job finished with failed nodes."""
    old = with_status(prepull(), phase, *nodes)
    new = with_status(prepull(), phase, *nodes, **{RETRY: "1"})
    errors = validate_update(new, old, policy=POLICY)
    if refusal is None:
        assert errors == ()
    else:
        assert paths(errors) == [f"metadata.annotations[{RETRY}]"]
        assert refusal in errors[0].message


def test_an_unchanged_or_already_handled_retry_value_asks_for_nothing() -> None:
    """Keeping the annotation, or setting it back to the handled value, is admitted whatever the phase."""
    old = with_status(prepull(), "InProgress", "InProgress", **{RETRY: "2"})
    old["status"]["retry"] = {"handled": "1", "attempt": 2}
    labelled = copy.deepcopy(old)
    labelled["metadata"]["labels"] = {"a": "b"}
    assert validate_update(labelled, old) == ()
    back = with_status(prepull(), "InProgress", "InProgress", **{RETRY: "1"})
    assert validate_update(back, old) == ()
    empty_handled = with_status(prepull(), "InProgress", "InProgress", **{RETRY: ""})
    assert validate_update(empty_handled, old | {"status": {"phase": "InProgress", "retry": {}}}) == ()


def test_a_retry_through_v1alpha1_is_refused_naming_the_version_to_use() -> None:
    """v1alpha1's status has no phase, so a retry asked through it is refused with where to ask instead."""
    old = with_status(prepull(V1), "Failure", "Failure")
    [error] = validate_update(with_status(prepull(V1), "Failure", "Failure", **{RETRY: "x"}), old)
    assert f"set it through {V2}" in error.message


def test_metadata_and_status_may_change_on_update() -> None:
    """Labels, finalizers and status can change while the spec stays the same."""
    old = upgrade()
    new = copy.deepcopy(old)
    new["metadata"] |= {"labels": {"a": "b"}, "finalizers": ["kubeedge.io/nodeupgradejob-controller"]}
    new["status"] = {"phase": "InProgress"}
    assert validate_update(new, old) == ()


def test_null_and_absent_spec_fields_are_the_same_on_update() -> None:
    """A client that sends back an absent field as null has not changed the spec."""
    assert validate_update(upgrade(failureTolerate=None), upgrade()) == ()


def test_unchanged_invalid_spec_can_still_be_updated() -> None:
    """An object stored before the webhook existed can still lose its finalizer on deletion."""
    legacy = upgrade(version="bogus", concurrency=0)
    finalizing = copy.deepcopy(legacy)
    finalizing["metadata"]["finalizers"] = []
    assert validate_update(finalizing, legacy) == ()


# ---------------------------------------------------------------------------------------------- defaults


def test_defaults_patch_adds_absent_concurrency_and_timeout() -> None:
    """Absent (or null) concurrency and timeoutSeconds are added as 1 and 300; present ones are left alone."""
    assert [(p.op, p.path, p.value) for p in default_patch(upgrade())] == [
        ("add", "/spec/concurrency", 1),
        ("add", "/spec/timeoutSeconds", 300),
    ]
    assert [p.path for p in default_patch(config_update(concurrency=None, timeoutSeconds=60))] == ["/spec/concurrency"]
    assert default_patch(upgrade(concurrency=3, timeoutSeconds=60)) == ()


def test_defaults_patch_targets_the_prepull_template() -> None:
    """ImagePrePullJob's limits live in spec.imagePrePullTemplate, so the patch does too."""
    assert [p.path for p in default_patch(prepull())] == [
        "/spec/imagePrePullTemplate/concurrency",
        "/spec/imagePrePullTemplate/timeoutSeconds",
    ]


def test_defaults_patch_leaves_an_explicit_zero_for_validation() -> None:
    """concurrency 0 is not rewritten to 1 (as KubeEdge does) but left to be rejected."""
    assert [p.path for p in default_patch(upgrade(concurrency=0))] == ["/spec/timeoutSeconds"]


@pytest.mark.parametrize(
    "obj", [None, [], {"spec": []}, {"kind": "ImagePrePullJob", "spec": {"imagePrePullTemplate": 1}}]
)
def test_defaults_patch_of_malformed_objects_is_empty(obj: object) -> None:
    """An object too malformed to locate its spec gets no patch (validation reports it)."""
    assert default_patch(obj) == ()


# ---------------------------------------------------------------------------------------------- handlers


def _review(operation: str, obj: object, old: object = None, **extra: Any) -> bytes:
    request = {
        "uid": "u-1",
        "kind": {"group": "operations.kubeedge.io", "version": "v1alpha2", "kind": "NodeUpgradeJob"},
        "operation": operation,
        "name": "j",
        "object": obj,
        "oldObject": old,
        **extra,
    }
    return msgspec.json.encode({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})


class Webhooks:
    """The two webhook routes behind a router, with their own registry."""

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.handler = router(admission_routes(policy=POLICY, registry=self.registry, log=structlog.get_logger()))

    async def post(self, path: str, body: bytes) -> Response:
        return await self.handler(Request(method="POST", path=path, query="", headers=(), body=body))

    async def review(self, path: str, body: bytes) -> Any:
        response = await self.post(path, body)
        assert response.status == 200
        assert response.content_type == "application/json"
        return msgspec.json.decode(response.body)


async def test_validate_denies_with_field_paths_and_counts_the_decision() -> None:
    """A denial echoes the uid, says 422 Invalid with the field paths, and increments the counter."""
    hooks = Webhooks()
    review = await hooks.review(VALIDATE_PATH, _review("CREATE", upgrade(version="x", concurrency=0)))
    assert review["apiVersion"] == "admission.k8s.io/v1"
    assert review["kind"] == "AdmissionReview"
    assert review["response"]["uid"] == "u-1"
    assert review["response"]["allowed"] is False
    assert review["response"]["status"]["code"] == 422
    assert "spec.version" in review["response"]["status"]["message"]
    assert "spec.concurrency" in review["response"]["status"]["message"]
    labels = {"webhook": "validating", "kind": "NodeUpgradeJob", "allowed": "false"}
    assert hooks.registry.get_sample_value("nodetaskd_controller_admission_decisions_total", labels) == 1.0


async def test_validate_allows_a_valid_create_and_an_unchanged_update() -> None:
    """A valid CREATE and an UPDATE that keeps the spec are allowed, without a status."""
    hooks = Webhooks()
    for body in (_review("CREATE", upgrade()), _review("UPDATE", upgrade(), upgrade())):
        assert (await hooks.review(VALIDATE_PATH, body))["response"] == {"uid": "u-1", "allowed": True}
    labels = {"webhook": "validating", "kind": "NodeUpgradeJob", "allowed": "true"}
    assert hooks.registry.get_sample_value("nodetaskd_controller_admission_decisions_total", labels) == 2.0


async def test_validate_ignores_subresource_requests() -> None:
    """A status-subresource review is allowed even if the spec looks changed (it cannot change there)."""
    body = _review("UPDATE", upgrade(version="v9.9.9"), upgrade(), subResource="status")
    assert (await Webhooks().review(VALIDATE_PATH, body))["response"]["allowed"] is True


async def test_unknown_kinds_are_counted_as_other() -> None:
    """The kind label only takes the node-job kinds, whatever a caller sends."""
    hooks = Webhooks()
    body = msgspec.json.encode(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": {}},
        }
    )
    assert (await hooks.review(VALIDATE_PATH, body))["response"]["allowed"] is False
    labels = {"webhook": "validating", "kind": "other", "allowed": "false"}
    assert hooks.registry.get_sample_value("nodetaskd_controller_admission_decisions_total", labels) == 1.0


async def test_mutate_answers_a_base64_json_patch() -> None:
    """The mutating answer carries patchType JSONPatch and the base64-encoded operations."""
    hooks = Webhooks()
    review = await hooks.review(MUTATE_PATH, _review("CREATE", upgrade()))
    assert review["response"]["patchType"] == "JSONPatch"
    assert msgspec.json.decode(base64.b64decode(review["response"]["patch"])) == [
        {"op": "add", "path": "/spec/concurrency", "value": 1},
        {"op": "add", "path": "/spec/timeoutSeconds", "value": 300},
    ]
    labels = {"webhook": "mutating", "kind": "NodeUpgradeJob", "allowed": "true"}
    assert hooks.registry.get_sample_value("nodetaskd_controller_admission_decisions_total", labels) == 1.0


async def test_mutate_without_defaults_to_add_has_no_patch() -> None:
    """A job that sets both limits gets a plain allow with no patch fields."""
    body = _review("CREATE", upgrade(concurrency=2, timeoutSeconds=60))
    assert (await Webhooks().review(MUTATE_PATH, body))["response"] == {"uid": "u-1", "allowed": True}


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"not json", "not an AdmissionReview"),
        (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}', "expected admission.k8s.io/v1"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}', "has no request"),
        (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 1}}', "uid"),
        (b'{"kind": "AdmissionReview"}', "apiVersion"),
    ],
)
async def test_malformed_review_is_400_with_the_reason(body: bytes, says: str) -> None:
    """A body that is not a v1 AdmissionReview with a request is refused with 400 saying why."""
    hooks = Webhooks()
    for path in (VALIDATE_PATH, MUTATE_PATH):
        response = await hooks.post(path, body)
        assert response.status == 400
        assert says in response.body.decode()


@pytest.mark.parametrize("where", ["review", "object"])
async def test_deeply_nested_review_is_400_naming_the_limit(where: str) -> None:
    """A review nested 10,000 deep, as a whole or inside the object it reviews, gets 400 naming the limit."""
    deep = b"[" * 10_000 + b"]" * 10_000
    body = deep if where == "review" else _review("CREATE", {}).replace(b'"object":{}', b'"object":' + deep)
    hooks = Webhooks()
    for path in (VALIDATE_PATH, MUTATE_PATH):
        response = await hooks.post(path, body)
        assert response.status == 400
        assert response.body.decode().startswith("not an AdmissionReview: nested too deeply: more than 64 levels")


async def test_a_denial_of_a_huge_object_is_short_and_so_is_its_log_line() -> None:
    """100,000 empty node names get a denial under 16 KiB that says there is more, and a log line under 4 KiB."""
    hooks = Webhooks()
    with capture_logs() as logs:
        review = await hooks.review(VALIDATE_PATH, _review("CREATE", upgrade(nodeNames=[""] * 100_000)))
    message = review["response"]["status"]["message"]
    assert len(msgspec.json.encode(review)) < 16 << 10
    assert message.startswith("spec.nodeNames[0]: must be a non-empty node name")
    assert message.endswith(str(STOPPED))
    (decided,) = [e for e in logs if e["event"] == "admission_decided"]
    assert len(decided["reason"]) <= LOGGED_REASON_CHARS
    assert len(repr(decided)) < 4 << 10


async def test_an_error_quoting_a_huge_value_is_clipped_in_the_denial() -> None:
    """A megabyte image reference is quoted only in part: the denial stays short and says how long it was."""
    review = await Webhooks().review(VALIDATE_PATH, _review("CREATE", upgrade(image="x" * 1_000_000)))
    message = review["response"]["status"]["message"]
    assert message.startswith("spec.image: must be an image repository")
    assert len(message) <= ERROR_CHARS + 32
    assert message.endswith("characters)")


@pytest.mark.parametrize(
    ("field", "value"),
    [("uid", "u" * 129), ("name", "n" * 254), ("subResource", "s" * 254), ("kind", {"kind": "K" * 254})],
)
async def test_a_review_with_identifiers_longer_than_the_api_servers_is_400(field: str, value: object) -> None:
    """The strings echoed in the answer or logged are as long at most as the API server sends them."""
    body = _review("CREATE", upgrade(), **{field: value})
    for path in (VALIDATE_PATH, MUTATE_PATH):
        response = await Webhooks().post(path, body)
        assert response.status == 400
        assert len(response.body) < 1 << 10


async def test_a_review_of_another_version_is_400_quoting_only_the_start_of_what_it_says() -> None:
    """A megabyte apiVersion is not echoed back whole."""
    body = msgspec.json.encode({"apiVersion": "v" * 1_000_000, "kind": "AdmissionReview"})
    response = await Webhooks().post(VALIDATE_PATH, body)
    assert response.status == 400
    assert response.body.startswith(b"expected admission.k8s.io/v1 AdmissionReview, got vvv")
    assert len(response.body) < 1 << 10


@pytest.mark.parametrize("api_version", [V1, V2])
def test_image_secrets_only_from_the_allowed_namespaces(api_version: str) -> None:
    """A Secret in another namespace is refused, listing the allowed ones and the setting that adds one."""
    assert validate_create(prepull(api_version, imageSecrets="kube-system/regcred"), policy=POLICY) == ()
    (error,) = validate_create(prepull(api_version, imageSecrets="default/regcred"), policy=POLICY)
    assert str(error) == (
        "spec.imagePrePullTemplate.imageSecrets: namespace 'default' is not one the hubs read image secrets from:"
        " only kube-system (the controller's and the hubs' imageSecretNamespaces setting)"
    )
    assert "only no namespace" in str(validate_create(prepull(api_version, imageSecrets="kube-system/regcred"))[0])
