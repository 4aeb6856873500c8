"""The API types decode KubeEdge's objects and reject malformed ones with the field path."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from schemas import v1alpha1, v1alpha2
from schemas.manifest import ManifestError, decode_job
from schemas.meta import LabelSelector, LabelSelectorRequirement

DATA = Path(__file__).parents[2] / "data"


def test_kubeedge_upgrade_sample_decodes() -> None:
    """KubeEdge's v1alpha1 NodeUpgradeJob sample decodes, its pruned extra fields ignored."""
    job = decode_job((DATA / "kubeedge-nodeupgradejob-v1alpha1.yaml").read_bytes(), fmt="yaml")
    assert isinstance(job, v1alpha1.NodeUpgradeJob)
    assert job.metadata.name == "upgrade-example"
    assert job.spec.version == "v1.16.0"
    assert job.spec.check_items == ("cpu", "mem", "disk")
    assert job.spec.failure_tolerate == "0.3"
    assert job.spec.concurrency == 2
    assert job.spec.timeout_seconds == 180
    assert job.spec.label_selector is not None
    assert job.spec.label_selector.match_labels == {
        "node-role.kubernetes.io/edge": "",
        "node-role.kubernetes.io/agent": "",
    }


def test_kubeedge_prepull_sample_decodes() -> None:
    """KubeEdge's v1alpha1 ImagePrePullJob sample decodes with its template keys."""
    job = decode_job((DATA / "kubeedge-imageprepulljob-v1alpha1.yaml").read_bytes(), fmt="yaml")
    assert isinstance(job, v1alpha1.ImagePrePullJob)
    template = job.spec.image_pre_pull_template
    assert template.images == ("busybox:latest",)
    assert template.node_names == ("edgenode1",)
    assert template.retry_times == 1
    assert template.timeout_seconds == 300


def test_v1alpha2_object_with_status_decodes_and_reencodes_kubeedge_keys() -> None:
    """A v1alpha2 NodeUpgradeJob with status round-trips with KubeEdge's exact keys."""
    raw = (DATA / "nodeupgradejob-v1alpha2-status.json").read_bytes()
    job = decode_job(raw)
    assert isinstance(job, v1alpha2.NodeUpgradeJob)
    assert job.status.phase is JobPhase.IN_PROGRESS
    first, second = job.status.node_status
    assert first.phase is NodeTaskPhase.SUCCESSFUL
    assert first.action_flow[0].status is ConditionStatus.TRUE
    assert second.reason == "the node is not ready"
    assert job.spec.image_digest_gatter is not None
    assert job.spec.image_digest_gatter.registry_api is not None
    spec = msgspec.json.decode(msgspec.json.encode(job.spec))
    assert set(spec) == {
        "version",
        "image",
        "nodeNames",
        "imageDigestGatter",
        "concurrency",
        "timeoutSeconds",
        "failureTolerate",
        "requireConfirmation",
    }
    assert spec["failureTolerate"] == "0.1"
    assert spec["imageDigestGatter"]["registryAPI"] == {"host": "r.example", "token": "t"}
    status = msgspec.json.decode(msgspec.json.encode(job.status))
    assert status["nodeStatus"][0]["actionFlow"][0] == {
        "action": "Check",
        "status": "True",
        "time": "2025-05-28T08:12:01Z",
    }
    assert status["nodeStatus"][0]["historicVersion"] == "v1.20.0"


def test_prepull_and_config_update_keys_match_kubeedge() -> None:
    """ImagePrePullJob and ConfigUpdateJob specs encode to KubeEdge's JSON keys."""
    prepull = v1alpha2.ImagePrePullJobSpec(
        image_pre_pull_template=v1alpha2.ImagePrePullTemplate(
            images=("nginx:1.25",),
            node_names=("edge-1",),
            image_secrets="default/regcred",
            retry_times=2,
            failure_tolerate="0.5",
            concurrency=3,
            timeout_seconds=60,
            check_items=("disk",),
        )
    )
    encoded = msgspec.json.decode(msgspec.json.encode(prepull))
    assert set(encoded["imagePrePullTemplate"]) == {
        "images",
        "nodeNames",
        "imageSecrets",
        "retryTimes",
        "failureTolerate",
        "concurrency",
        "timeoutSeconds",
        "checkItems",
    }
    update = v1alpha2.ConfigUpdateJobSpec(node_names=("edge-1",), update_fields={"modules.edgeStream.enable": "true"})
    assert msgspec.json.decode(msgspec.json.encode(update)) == {
        "nodeNames": ["edge-1"],
        "updateFields": {"modules.edgeStream.enable": "true"},
    }


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"concurrency": "three"}, "$.spec.concurrency"),
        ({"nodeNames": "edge-1"}, "$.spec.nodeNames"),
        ({"timeoutSeconds": -1}, "$.spec.timeoutSeconds"),
        ({"failureTolerate": "lots"}, "$.spec.failureTolerate"),
        ({"labelSelector": {"matchLabels": {"a": 1}}}, "$.spec.labelSelector.matchLabels"),
        ({"requireConfirmation": "yes"}, "$.spec.requireConfirmation"),
    ],
)
def test_wrong_shape_is_rejected_naming_the_field(patch: dict[str, object], path: str) -> None:
    """A CR whose field has the wrong type is rejected with the field's path in the message."""
    doc = {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "NodeUpgradeJob", "spec": patch}
    with pytest.raises(ManifestError, match=path.replace("$", r"\$").replace(".", r"\.")):
        decode_job(msgspec.json.encode(doc))


@pytest.mark.parametrize("tolerance", ["1.5", "-0.1", "NaN", "Infinity", " 0.5", "0.5\n", "\uff10.5", "0_5"])
def test_failure_tolerate_outside_zero_to_one_is_rejected(tolerance: str) -> None:
    """failureTolerate is an ASCII decimal within [0, 1] when the job is decoded, never silently clamped or trimmed."""
    doc = {
        "apiVersion": "operations.kubeedge.io/v1alpha2",
        "kind": "ConfigUpdateJob",
        "spec": {"failureTolerate": tolerance, "updateFields": {"a": "b"}},
    }
    with pytest.raises(ManifestError, match="failureTolerate"):
        decode_job(msgspec.json.encode(doc))


def test_unknown_kind_and_version_are_named() -> None:
    """An object of another kind or an unserved version is rejected, saying which."""
    with pytest.raises(ManifestError, match="kind 'Deployment' is not a node job"):
        decode_job(b'{"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "Deployment"}')
    with pytest.raises(ManifestError, match="ConfigUpdateJob is not served at version 'v1alpha1'"):
        decode_job(b'{"apiVersion": "operations.kubeedge.io/v1alpha1", "kind": "ConfigUpdateJob"}')
    with pytest.raises(ManifestError, match=r"not in the operations\.kubeedge\.io group"):
        decode_job(b'{"apiVersion": "apps/v1", "kind": "NodeUpgradeJob"}')


def test_label_selector_matches_like_the_api_server() -> None:
    """matchLabels and each matchExpressions operator select as Kubernetes does."""
    selector = LabelSelector(
        match_labels={"node-role.kubernetes.io/edge": ""},
        match_expressions=(
            LabelSelectorRequirement(key="zone", operator="In", values=("a", "b")),
            LabelSelectorRequirement(key="tier", operator="NotIn", values=("db",)),
            LabelSelectorRequirement(key="gpu", operator="DoesNotExist"),
            LabelSelectorRequirement(key="arch", operator="Exists"),
        ),
    )
    base = {"node-role.kubernetes.io/edge": "", "zone": "a", "arch": "arm64"}
    assert selector.matches(base)
    assert not selector.matches({**base, "zone": "c"})
    assert not selector.matches({**base, "tier": "db"})
    assert not selector.matches({**base, "gpu": "1"})
    assert not selector.matches({k: v for k, v in base.items() if k != "arch"})
    assert selector.to_query() == "node-role.kubernetes.io/edge=,zone in (a,b),tier notin (db),!gpu,arch"


def test_label_selector_rejects_bad_operators() -> None:
    """An unknown operator or values on Exists is a validation error naming the operator."""
    with pytest.raises(msgspec.ValidationError, match="'Near' is not one of"):
        msgspec.convert({"matchExpressions": [{"key": "a", "operator": "Near"}]}, type=LabelSelector)
    with pytest.raises(msgspec.ValidationError, match="Exists takes no values"):
        msgspec.convert({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, type=LabelSelector)
