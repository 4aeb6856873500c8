"""The committed CRD manifests are current and structurally valid for Kubernetes 1.20."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from schemas import crdgen
from schemas.diagnosis.kinds import DIAGNOSIS_KINDS
from schemas.kinds import KINDS


def _walk(node: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, node)]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_walk(value, f"{path}.{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_walk(value, f"{path}[{i}]"))
    return out


@pytest.mark.parametrize(("name", "text"), sorted(crdgen.expected_files().items()))
def test_committed_crd_is_current(name: str, text: str) -> None:
    """The YAML under schemas/crds equals what `just crds` generates from the Struct types now."""
    committed = (crdgen.CRD_DIR / name).read_text()
    assert committed == text, f"schemas/crds/{name} is stale: run `just crds`"


@pytest.mark.parametrize("kind", KINDS + DIAGNOSIS_KINDS, ids=lambda k: k.kind)
def test_crd_schemas_are_structural(kind: Any) -> None:
    """Every schema node has a type, and there is no $ref, default, anyOf or CEL rule."""
    crd = yaml.safe_load(crdgen.render(kind))
    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        for path, node in _walk(schema):
            if not isinstance(node, dict) or path.endswith(".properties"):
                continue
            assert "$ref" not in node, path
            assert "anyOf" not in node, path
            assert "default" not in node, path
            assert "x-kubernetes-validations" not in node, path
            assert "type" in node, f"{path} has no type"


def test_crd_versions_scope_and_names() -> None:
    """Cluster scope, status subresource, v1alpha2 stored, v1alpha1 served, plus our names and columns."""
    by_kind = {k.kind: yaml.safe_load(crdgen.render(k)) for k in KINDS}
    for kind, crd in by_kind.items():
        spec = crd["spec"]
        assert spec["group"] == "operations.kubeedge.io"
        assert spec["scope"] == "Cluster"
        assert "nodejobs" in spec["names"]["categories"]
        assert spec["names"]["shortNames"]
        served = {v["name"]: v["storage"] for v in spec["versions"]}
        expected = {"v1alpha2": True} if kind == "ConfigUpdateJob" else {"v1alpha1": False, "v1alpha2": True}
        assert served == expected
        for version in spec["versions"]:
            assert version["served"] is True
            assert version["subresources"] == {"status": {}}
            columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
            assert columns["Phase"] == ".status.phase"
            assert columns["Nodes"] == ".status.nodeCounts.total"
            assert columns["Age"] == ".metadata.creationTimestamp"
    upgrade = by_kind["NodeUpgradeJob"]["spec"]["versions"][1]["schema"]["openAPIV3Schema"]
    assert upgrade["properties"]["status"]["required"] == ["phase"]
    spec_props = upgrade["properties"]["spec"]["properties"]
    assert "imageDigestGatter" in spec_props
    assert spec_props["failureTolerate"]["type"] == "string"
    assert spec_props["timeoutSeconds"] == {"format": "int32", "type": "integer", "minimum": 0, "nullable": True}
    prepull = by_kind["ImagePrePullJob"]["spec"]["versions"][1]["schema"]["openAPIV3Schema"]
    assert prepull["required"] == ["spec"]
    assert "imageSecrets" in prepull["properties"]["spec"]["properties"]["imagePrePullTemplate"]["properties"]
    update = by_kind["ConfigUpdateJob"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = update["properties"]["spec"]["properties"]["updateFields"]
    assert fields == {"type": "object", "additionalProperties": {"type": "string"}}


# Short names of the built-in resources of Kubernetes 1.20, which a CRD must not shadow.
_CORE_SHORT_NAMES = frozenset(
    {
        "cs",
        "cm",
        "ds",
        "deploy",
        "ep",
        "ev",
        "hpa",
        "ing",
        "limits",
        "no",
        "ns",
        "pdb",
        "po",
        "psp",
        "pv",
        "pvc",
        "quota",
        "rc",
        "rs",
        "sa",
        "sc",
        "sts",
        "svc",
        "crd",
        "csr",
        "netpol",
        "pc",
    }
)


def test_diagnosis_crds_scope_names_and_columns() -> None:
    """KubeDiag's group at v1, cluster-scoped Operation(Set), namespaced Diagnosis and Task, one category."""
    crds = {k.kind: yaml.safe_load(crdgen.render(k)) for k in DIAGNOSIS_KINDS}
    scopes = {kind: crd["spec"]["scope"] for kind, crd in crds.items()}
    assert scopes == {
        "Operation": "Cluster",
        "OperationSet": "Cluster",
        "Diagnosis": "Namespaced",
        "Task": "Namespaced",
    }
    short_names = set()
    for crd in crds.values():
        spec = crd["spec"]
        assert spec["group"] == "diagnosis.kubediag.org"
        assert spec["names"]["categories"] == ["kubediag"]
        short_names.update(spec["names"]["shortNames"])
        [version] = spec["versions"]
        assert (version["name"], version["served"], version["storage"]) == ("v1", True, True)
        assert version["additionalPrinterColumns"][-1]["name"] == "Age"
    assert short_names == {"op", "opset", "diag", "diagtask"}
    assert not short_names & _CORE_SHORT_NAMES
    diag = crds["Diagnosis"]["spec"]["versions"][0]
    columns = {c["name"]: c["jsonPath"] for c in diag["additionalPrinterColumns"]}
    assert columns["OperationSet"] == ".spec.operationSet"
    assert columns["Phase"] == ".status.phase"
    assert diag["subresources"] == {"status": {}}
    assert "subresources" not in crds["Operation"]["spec"]["versions"][0]  # an Operation has no status
    schema = diag["schema"]["openAPIV3Schema"]
    assert schema["required"] == ["spec"]
    targets = schema["properties"]["spec"]["properties"]["targetSelector"]["properties"]
    assert set(targets) == {
        "targetNodeSelector",
        "targetNodeNames",
        "targetPodSelector",
        "targetPodNames",
        "nodeSelector",
        "nodeNames",
        "podSelector",
        "podReferences",
    }
    assert targets["nodeSelector"]["x-kubernetes-map-type"] == "atomic"
    status = schema["properties"]["status"]["properties"]
    checkpoint = status["checkpoint"]["properties"]
    assert list(checkpoint) == [
        "pathIndex",
        "nodeIndex",
        "desired",
        "active",
        "succeeded",
        "failed",
        "synchronizedTasks",
        "synchronizedNodes",
    ]
    operations = status["context"]["properties"]["operations"]
    assert operations["additionalProperties"]["additionalProperties"] == {
        "type": "object",
        "additionalProperties": {"type": "string"},
    }


def test_generated_crds_carry_no_yaml_aliases() -> None:
    """A list shared by two schema nodes is written out twice, never as an anchor and alias."""
    for kind in KINDS + DIAGNOSIS_KINDS:
        text = crdgen.render(kind)
        assert "&id" not in text
        assert "*id" not in text


def test_only_nodetaskds_own_choices_are_closed_enums_in_the_schema() -> None:
    """``component`` lists the components agents act on; KubeEdge's phases and actions stay open strings."""
    for kind in KINDS:
        crd = yaml.safe_load(crdgen.render(kind))
        enums = {
            path: node["enum"]
            for version in crd["spec"]["versions"]
            for path, node in _walk(version["schema"]["openAPIV3Schema"])
            if isinstance(node, dict) and "enum" in node
        }
        if kind.kind in ("NodeUpgradeJob", "ConfigUpdateJob"):
            assert list(enums.values()) == [["kubelet", "nodetaskd"]], enums
            assert all(path.endswith(".component") for path in enums), enums
        else:
            assert enums == {}, enums


def test_every_crd_carries_the_installs_recommended_labels() -> None:
    """``app.kubernetes.io/name: nodetaskd`` on each CRD, as on every other object of the install."""
    for kind in KINDS + DIAGNOSIS_KINDS:
        labels = yaml.safe_load(crdgen.render(kind))["metadata"]["labels"]
        assert labels == {"app.kubernetes.io/name": "nodetaskd", "app.kubernetes.io/component": "crds"}
