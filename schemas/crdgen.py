"""Generate the CustomResourceDefinitions from the Struct types.

``python -m schemas.crdgen [OUTDIR]`` (``just crds``) writes one YAML file per kind, node jobs and
diagnosis kinds alike. msgspec's JSON
Schema is turned into a Kubernetes *structural* schema: ``$ref`` inlined, ``Optional`` as
``nullable``, no ``default``/``title``/``enum`` (KubeEdge's CRDs have none, and defaults belong to the
webhook) but on nodetaskd's own choices (:data:`_CLOSED_ENUMS`), no ``additionalProperties: false``
(structural schemas forbid it beside ``properties``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from schemas.diagnosis.kinds import DIAGNOSIS_CATEGORY, DIAGNOSIS_KINDS, DiagnosisKind
from schemas.kinds import CATEGORY, GROUP, KINDS, Kind

CRD_DIR = Path(__file__).parent / "crds"

# Fields KubeEdge's CRDs mark required although the Go types give them defaults.
_REQUIRED: Mapping[tuple[str, str], tuple[str, ...]] = {
    ("ImagePrePullJob", "v1alpha2"): ("spec",),
    ("ImagePrePullJob", "v1alpha1"): ("spec",),
}
_STATUS_REQUIRED: Mapping[tuple[str, str], tuple[str, ...]] = {(k.kind, "v1alpha2"): ("phase",) for k in KINDS}
_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "nodetaskd", "app.kubernetes.io/component": "crds"}
"""The recommended labels every object of the install carries (``kubectl get crd -l
app.kubernetes.io/name=nodetaskd``)."""
_CLOSED_ENUMS = frozenset({"NodeComponent"})
"""Enumerations of nodetaskd's own fields, closed in the schema as well as by the webhook: no KubeEdge object
carries them, and an API server without the webhook must not store a component no agent acts on."""
_INT_BOUNDS = frozenset({-(2**31), 2**31 - 1, 2**32 - 1})
_ATOMIC_SELECTOR = {"x-kubernetes-map-type": "atomic"}
_SELECTOR_KEYS = frozenset({"labelSelector", "nodeSelector", "podSelector", "targetNodeSelector", "targetPodSelector"})

_PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Nodes", "type": "integer", "jsonPath": ".status.nodeCounts.total"},
    {"name": "Running", "type": "integer", "jsonPath": ".status.nodeCounts.inProgress"},
    {"name": "Succeeded", "type": "integer", "jsonPath": ".status.nodeCounts.successful"},
    {"name": "Failed", "type": "integer", "jsonPath": ".status.nodeCounts.failure"},
    {"name": "Unknown", "type": "integer", "jsonPath": ".status.nodeCounts.unknown", "priority": 1},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)


def _column(name: str, type_: str, json_path: str, priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": type_, "jsonPath": json_path}
    if priority:
        column["priority"] = priority
    return column


_AGE = _column("Age", "date", ".metadata.creationTimestamp")
# KubeDiag's columns, plus where a run is and what an Operation runs.
_DIAGNOSIS_COLUMNS: Mapping[str, tuple[dict[str, Any], ...]] = {
    "Operation": (
        _column("Builtin", "string", ".spec.processor.builtin.name"),
        _column("Address", "string", ".spec.processor.httpServer.address"),
        _column("Script", "string", ".spec.processor.scriptRunner.script", priority=1),
        _column("Timeout", "integer", ".spec.processor.timeoutSeconds"),
        _AGE,
    ),
    "OperationSet": (_column("Ready", "boolean", ".status.ready"), _AGE),
    "Diagnosis": (
        _column("OperationSet", "string", ".spec.operationSet"),
        _column("Phase", "string", ".status.phase"),
        _column("Path", "integer", ".status.checkpoint.pathIndex", priority=1),
        _column("Stage", "integer", ".status.checkpoint.nodeIndex", priority=1),
        _AGE,
    ),
    "Task": (
        _column("Operation", "string", ".spec.operation"),
        _column("NodeName", "string", ".spec.nodeName"),
        _column("PodNamespace", "string", ".spec.podReference.namespace", priority=1),
        _column("PodName", "string", ".spec.podReference.name", priority=1),
        _column("PodContainer", "string", ".spec.podReference.container", priority=1),
        _column("Phase", "string", ".status.phase"),
        _AGE,
    ),
}


def _structural(node: Any, defs: Mapping[str, Any]) -> Any:
    """Rewrite one JSON Schema node into its structural OpenAPI v3 form."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].removeprefix("#/$defs/")
        closed = {"enum": defs[name]["enum"]} if name in _CLOSED_ENUMS else {}
        return {**_structural(defs[name], defs), **closed}
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != {"type": "null"}]
        if len(options) != 1:
            raise ValueError(f"cannot express a union of {len(options)} types structurally: {node}")
        return {**_structural(options[0], defs), "nullable": True}
    out: dict[str, Any] = {}
    if "enum" in node and "type" not in node and all(isinstance(v, str) for v in node["enum"]):
        out["type"] = "string"  # phases stay open strings, as in KubeEdge's CRDs
    for key, value in node.items():
        if key in ("title", "default", "enum", "$defs"):
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "format" and value == "decimal":
            continue
        if key == "required" and not value:
            continue
        if key in ("minimum", "maximum") and value in _INT_BOUNDS:
            continue  # the width is already said by ``format``; only real bounds are kept
        if key == "description":
            out[key] = value.replace("``", "")
            continue
        if key == "properties":
            out[key] = {k: _structural(v, defs) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _structural(value, defs)
        else:
            out[key] = value
    return out


def version_schema(kind: Kind, version: str) -> dict[str, Any]:
    """The ``openAPIV3Schema`` of one served version."""
    obj_type = kind.versions[version]
    raw = msgspec.json.schema(obj_type)
    defs = raw.get("$defs", {})
    schema: dict[str, Any] = _structural(raw, defs)
    props = schema["properties"]
    props["metadata"] = {"type": "object"}
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    schema["required"] = list(_REQUIRED.get((kind.kind, version), ()))
    if not schema["required"]:
        del schema["required"]
    status_required = _STATUS_REQUIRED.get((kind.kind, version))
    if status_required:
        props["status"]["required"] = list(status_required)
    _mark_selectors(schema)
    schema.pop("description", None)
    return schema


def _mark_selectors(node: Any) -> None:
    """Label selectors (and their expressions) are atomic, as controller-gen marks them."""
    if isinstance(node, dict):
        for key, value in node.get("properties", {}).items():
            if key in _SELECTOR_KEYS:
                value.update(_ATOMIC_SELECTOR)
                exprs = value["properties"]["matchExpressions"]
                exprs["x-kubernetes-list-type"] = "atomic"
            _mark_selectors(value)
        if "items" in node:
            _mark_selectors(node["items"])


def crd(kind: Kind) -> dict[str, Any]:
    """The whole CustomResourceDefinition of one kind."""
    versions = [
        {
            "name": version,
            "served": True,
            "storage": version == kind.storage_version,
            "schema": {"openAPIV3Schema": version_schema(kind, version)},
            "subresources": {"status": {}},
            "additionalPrinterColumns": [dict(c) for c in _PRINTER_COLUMNS],
        }
        for version in kind.versions
    ]
    return _definition(kind, group=GROUP, category=CATEGORY, namespaced=False, versions=versions)


def _definition(
    kind: Kind | DiagnosisKind, *, group: str, category: str, namespaced: bool, versions: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": dict(_LABELS)},
        "spec": {
            "group": group,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [category],
            },
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": versions,
        },
    }


def diagnosis_crd(kind: DiagnosisKind) -> dict[str, Any]:
    """The CustomResourceDefinition of one diagnosis kind."""
    raw = msgspec.json.schema(kind.object_type)
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    props = schema["properties"]
    props["metadata"] = {"type": "object"}
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    _mark_selectors(schema)
    schema.pop("description", None)
    version = {
        "name": kind.version,
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": schema},
        "subresources": {"status": {}},
        "additionalPrinterColumns": [dict(c) for c in _DIAGNOSIS_COLUMNS[kind.kind]],
    }
    if "status" not in props:
        del version["subresources"]  # an Operation has a spec only
    return _definition(
        kind, group=kind.group, category=DIAGNOSIS_CATEGORY, namespaced=kind.namespaced, versions=[version]
    )


class _Dumper(yaml.SafeDumper):
    """Writes a list shared by two schema nodes twice instead of as a YAML anchor and alias."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def render(kind: Kind | DiagnosisKind) -> str:
    """The CRD as the YAML text committed under ``schemas/crds``."""
    header = "# Generated by `just crds` (python -m schemas.crdgen) from the Struct types. Do not edit.\n"
    document = diagnosis_crd(kind) if isinstance(kind, DiagnosisKind) else crd(kind)
    return header + yaml.dump(document, Dumper=_Dumper, sort_keys=False, width=120)


def expected_files() -> dict[str, str]:
    """File name to content, for every kind."""
    files = {f"{GROUP}_{k.plural}.yaml": render(k) for k in KINDS}
    files.update({f"{k.group}_{k.plural}.yaml": render(k) for k in DIAGNOSIS_KINDS})
    return files


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else CRD_DIR
    out.mkdir(parents=True, exist_ok=True)
    for name, text in expected_files().items():
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
