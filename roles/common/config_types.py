"""What every role's configuration shares: the base Struct (log level and format), field types, and checks.

Each role's Struct (:mod:`roles.common.controller_config`, :mod:`roles.common.cloud_config`,
:mod:`roles.common.edge_config`) builds on :class:`BaseConfig`; unknown keys are errors that name the
key, so a misspelt option is reported at start instead of silently ignored.
"""

from __future__ import annotations

import re
from typing import Annotated, Final

import msgspec

__all__ = [
    "DEFAULT_IMAGE_SECRET_NAMESPACES",
    "DEFAULT_TLS_RELOAD_INTERVAL",
    "NAMESPACE",
    "BaseConfig",
    "LoopbackPort",
    "Percent",
    "Port",
    "Seconds",
    "address",
    "check_namespaces",
]

NAMESPACE: Final = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
"""A Kubernetes namespace name (a DNS-1123 label)."""

Seconds = Annotated[float, msgspec.Meta(gt=0)]
Percent = Annotated[float, msgspec.Meta(ge=0, le=100)]
Port = Annotated[int, msgspec.Meta(ge=0, le=65535)]
LoopbackPort = Annotated[int, msgspec.Meta(ge=1, le=65535)]

DEFAULT_TLS_RELOAD_INTERVAL: Final = 5.0
"""A rotation is served 5 to 10 seconds after it is on disk, well within the minute or so a kubelet
takes to bring a changed Secret into a pod; a look is a few stat calls."""
DEFAULT_IMAGE_SECRET_NAMESPACES: Final = ("kube-system",)
"""Where registry Secrets for pre-pulls may live by default: the default ``tokenNamespace``, which
only cluster administrators write to. Anyone who may create a job could otherwise have any registry
Secret in the cluster sent to a node of their choice."""


class BaseConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """What every role's configuration has: how it logs."""

    log_level: str = "info"
    log_format: str = "console"
    """``console`` for people, ``json`` for log collectors."""

    def __post_init__(self) -> None:
        if self.log_level not in ("debug", "info", "warning", "error"):
            raise ValueError(f"logLevel {self.log_level!r} is not one of debug, info, warning, error")
        if self.log_format not in ("console", "json"):
            raise ValueError(f"logFormat {self.log_format!r} is not one of console, json")


def check_namespaces(namespaces: tuple[str, ...]) -> None:
    """ValueError naming ``imageSecretNamespaces`` unless each of ``namespaces`` is a namespace name."""
    for namespace in namespaces:
        if not NAMESPACE.fullmatch(namespace):
            raise ValueError(f"imageSecretNamespaces: {namespace!r} is not a namespace name")


def address(text: str) -> tuple[str, int]:
    """``host:port`` (or ``[v6]:port``) as (host, port); the form is checked by the Struct that holds it."""
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)
