"""The Kubernetes paths and documents of a device's local API: which kinds it serves, where, and how
it describes itself to clients (discovery), as data and pure functions.

Only the kinds a device caches are served, read-only: ``get``, ``list`` and ``watch`` of core/v1
Nodes, Pods, ConfigMaps and Secrets, at the API server's paths (and the legacy ``/watch/`` ones).
"""

from __future__ import annotations

from typing import Final
from urllib.parse import unquote

import msgspec

from roles.edge.cache.kinds import RESOURCES, Resource

__all__ = [
    "EMULATED_VERSION",
    "Target",
    "api_group_list",
    "api_resource_list",
    "api_versions",
    "parse_target",
    "version_info",
]

EMULATED_VERSION: Final = (1, 20, 2)
"""The Kubernetes version whose behaviour the local API follows (the project's pinned API server):
its selector syntax and error messages, and what ``/version`` reports."""


VERBS: Final = ("get", "list", "watch")
_GROUP_VERSIONS: Final = frozenset((r.group, r.version) for r in RESOURCES.values() if r.group)


class Target(msgspec.Struct, frozen=True):
    """What a resource path names: one object (``name``) or a collection, in ``namespace`` or all."""

    resource: Resource
    namespace: str = ""
    name: str = ""
    watch: bool = False
    """Asked on a legacy ``/api/v1/watch/...`` path."""


def parse_target(path: str) -> Target | None:
    """The target of an ``/api/v1/...`` (or a cached group's ``/apis/...``) resource path, or None when the
    path names nothing served
    (another kind, a subresource, a namespaced path for a cluster-scoped kind, or the reverse)."""
    split = _group_and_rest(path)
    if split is None:
        return None
    group, rest = split
    watch = rest[:1] == ["watch"]
    if watch:
        rest = rest[1:]
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 2 or (resource := RESOURCES.get(rest[0])) is None or resource.group != group:
        return None
    name = rest[1] if len(rest) == 2 else ""
    if namespace and not resource.namespaced:
        return None
    if name and resource.namespaced and not namespace:
        return None  # a namespaced object is only ever named with its namespace
    return Target(resource=resource, namespace=namespace, name=name, watch=watch)


def _group_and_rest(path: str) -> tuple[str, list[str]] | None:
    """The API group a path is under (``""``: the core group) and its parts after the version."""
    parts = [unquote(p) for p in path.split("/")]
    if parts[:3] == ["", "api", "v1"]:
        group, rest = "", parts[3:]
    elif parts[:2] == ["", "apis"] and len(parts) >= 4 and (parts[2], parts[3]) in _GROUP_VERSIONS:
        group, rest = parts[2], parts[4:]
    else:
        return None
    return None if any(not p for p in rest) else (group, rest)


def api_versions(server_address: str) -> bytes:
    """``/api``: the legacy group's versions."""
    return msgspec.json.encode(
        {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}],
        }
    )


def api_resource_list() -> bytes:
    """``/api/v1``: the served kinds, enough for kubectl to map ``pods``, ``po`` or ``pod`` to a path."""
    return msgspec.json.encode(
        {
            "kind": "APIResourceList",
            "groupVersion": "v1",
            "resources": [
                {
                    "name": r.plural,
                    "singularName": r.singular,
                    "namespaced": r.namespaced,
                    "kind": r.kind,
                    "verbs": list(VERBS),
                    **({"shortNames": list(r.short_names)} if r.short_names else {}),
                }
                for r in RESOURCES.values()
                if not r.group
            ],
        }
    )


def api_group_list() -> bytes:
    """``/apis``: no named groups are served."""
    return msgspec.json.encode({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})


def version_info() -> bytes:
    """``/version``: the emulated Kubernetes version, marked as this local API's."""
    major, minor, patch = EMULATED_VERSION
    return msgspec.json.encode(
        {
            "major": str(major),
            "minor": str(minor),
            "gitVersion": f"v{major}.{minor}.{patch}+nodetaskd-local",
            "gitCommit": "",
            "gitTreeState": "",
            "buildDate": "",
            "goVersion": "",
            "compiler": "",
            "platform": "",
        }
    )
