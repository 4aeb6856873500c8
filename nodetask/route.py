"""Routes: which node task a message is about.

A route is ``<apiVersion>/<type>/<job>/nodes/<node>``, e.g.
``operations.kubeedge.io/v1alpha2/nodeupgradejob/upgrade-v1-21/nodes/edge-1``. The design document
uses the plural ``nodes``; KubeEdge's code writes the singular ``node``, so parsing accepts both and
formatting writes the plural unless asked for KubeEdge's form.

Parsing fails loudly with :class:`RouteError` saying which part is wrong; KubeEdge returns an empty
resource and lets the next layer guess.
"""

from __future__ import annotations

import re
from typing import Final, final

from nodetask.names import MAX_LABEL, MAX_SUBDOMAIN, SUBDOMAIN_PATTERN, clip

__all__ = ["MAX_ROUTE_CHARS", "Route", "RouteError"]

# Kubernetes object names (RFC 1123 subdomains), which job and node names are, and API groups.
_NAME = re.compile(SUBDOMAIN_PATTERN)
_GROUP = _NAME
_VERSION = re.compile(r"v[0-9]+((alpha|beta)[0-9]+)?")
_JOB_TYPE = re.compile(r"[a-z][a-z0-9]*")
# The whole route in one expression: the fast path for well-formed routes, which are nearly all of
# them. The part-by-part checks above run only to explain a route this does not match.
_ROUTE = re.compile(
    rf"(?P<api>(?P<group>{_GROUP.pattern})/(?P<version>{_VERSION.pattern}))/(?P<type>{_JOB_TYPE.pattern})"
    rf"/(?P<job>{_NAME.pattern})/nodes?/(?P<node>{_NAME.pattern})"
)
# Kubernetes' limits: groups, job and node names are subdomains, versions and resource types labels.
_LIMITS: Final = {
    "group": MAX_SUBDOMAIN,
    "version": MAX_LABEL,
    "type": MAX_LABEL,
    "job": MAX_SUBDOMAIN,
    "node": MAX_SUBDOMAIN,
}
MAX_ROUTE_CHARS: Final = sum(_LIMITS.values()) + len("////nodes/")
"""No valid route is longer: a longer text is refused before any pattern runs or anything is cached."""


class RouteError(ValueError):
    """A malformed route; the message says which part is wrong."""


def _check(part: str, value: str, pattern: re.Pattern[str], what: str, limit: int) -> None:
    if not value:
        raise RouteError(f"the {part} must not be blank")
    if len(value) > limit:
        raise RouteError(f"the {part} {clip(value, 64)!r} is longer than {limit} characters")
    if not pattern.fullmatch(value):
        raise RouteError(f"the {part} {clip(value)!r} is not {what}")


@final
class Route:
    """A parsed route; constructing one validates every part.

    A plain class rather than a dataclass on purpose: msgspec would encode a dataclass as an object,
    while on the wire a route is its string form.
    """

    __slots__ = ("api_version", "job", "job_type", "node")

    api_version: str
    """``group/version``, e.g. ``operations.kubeedge.io/v1alpha2``."""
    job_type: str
    """KubeEdge's resource type, e.g. ``nodeupgradejob``."""
    job: str
    node: str

    def __init__(self, api_version: str, job_type: str, job: str, node: str) -> None:
        group, sep, version = api_version.partition("/")
        if not api_version:
            raise RouteError("the apiVersion must not be blank")
        if not sep:
            raise RouteError(f"the apiVersion {clip(api_version)!r} is not of the form group/version")
        _check("apiVersion group", group, _GROUP, "a DNS subdomain", MAX_SUBDOMAIN)
        _check("apiVersion version", version, _VERSION, "a Kubernetes version such as v1alpha2", MAX_LABEL)
        _check("job type", job_type, _JOB_TYPE, "a lower-case resource type such as nodeupgradejob", MAX_LABEL)
        _check("job name", job, _NAME, "a Kubernetes object name", MAX_SUBDOMAIN)
        _check("node name", node, _NAME, "a Kubernetes object name", MAX_SUBDOMAIN)
        set_ = object.__setattr__  # the instance is immutable once built (routes are shared and hashed)
        set_(self, "api_version", api_version)
        set_(self, "job_type", job_type)
        set_(self, "job", job)
        set_(self, "node", node)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Route is immutable: cannot set {name}")

    def _key(self) -> tuple[str, str, str, str]:
        return (self.api_version, self.job_type, self.job, self.node)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Route) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Route({str(self)!r})"

    def __str__(self) -> str:
        return f"{self.api_version}/{self.job_type}/{self.job}/nodes/{self.node}"

    def kubeedge(self) -> str:
        """The form KubeEdge's cloudcore writes, with the singular ``node`` segment."""
        return f"{self.api_version}/{self.job_type}/{self.job}/node/{self.node}"

    @classmethod
    def parse(cls, text: str) -> Route:
        """Parse ``<group>/<version>/<type>/<job>/nodes|node/<node>``.

        Errors:
            :class:`RouteError` naming the first part that is missing or malformed.
        """
        if len(text) > MAX_ROUTE_CHARS:
            raise RouteError(f"route {clip(text, 64)!r} is longer than any valid route ({MAX_ROUTE_CHARS} characters)")
        match = _ROUTE.fullmatch(text)
        if match is not None and all(len(match[part]) <= limit for part, limit in _LIMITS.items()):
            route = object.__new__(cls)
            _set_api_version(route, match["api"])
            _set_job_type(route, match["type"])
            _set_job(route, match["job"])
            _set_node(route, match["node"])
            return route
        parts = text.split("/")
        if len(parts) != 6:
            raise RouteError(
                f"route {clip(text)!r} has {len(parts)} '/'-separated parts, "
                "expected 6: <group>/<version>/<type>/<job>/nodes/<node>"
            )
        group, version, job_type, job, keyword, node = parts
        if keyword not in ("nodes", "node"):
            raise RouteError(f"route {clip(text)!r}: expected 'nodes' before the node name, found {clip(keyword)!r}")
        return cls(api_version=f"{group}/{version}", job_type=job_type, job=job, node=node)


# Slot setters, bypassing the immutability guard for the parser's fast path.
_set_api_version = Route.__dict__["api_version"].__set__
_set_job_type = Route.__dict__["job_type"].__set__
_set_job = Route.__dict__["job"].__set__
_set_node = Route.__dict__["node"].__set__
