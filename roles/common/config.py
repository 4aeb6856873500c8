"""Role configuration: a YAML file decoded into the role's typed Struct, then overridden by flags.

Each role has its own Struct (:mod:`roles.common.controller_config`, :mod:`roles.common.cloud_config`,
:mod:`roles.common.edge_config`, on :mod:`roles.common.config_types`); unknown keys are errors that
name the key, so a misspelt option is reported at start instead of silently ignored, and so is a key
given twice (naming it and its lines), whose first value YAML would otherwise drop. This module loads
them, and is the face (``__all__``) the roles import every configuration type from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import msgspec

from nodetask import nesting
from roles.common.cloud_config import CloudConfig
from roles.common.controller_config import ControllerConfig
from roles.common.edge_config import AutonomyConfig, DiagnosisConfig, EdgeConfig, LocalApiConfig, ScriptsConfig

__all__ = [
    "AutonomyConfig",
    "CloudConfig",
    "ConfigError",
    "ControllerConfig",
    "DiagnosisConfig",
    "EdgeConfig",
    "LocalApiConfig",
    "RoleConfig",
    "ScriptsConfig",
    "load_config",
]


class ConfigError(ValueError):
    """The configuration file or a flag is invalid; the message names the field."""


RoleConfig = ControllerConfig | CloudConfig | EdgeConfig

ROLE_CONFIGS: Final[dict[str, type[RoleConfig]]] = {
    "controller": ControllerConfig,
    "cloud": CloudConfig,
    "edge": EdgeConfig,
}


def load_config(role: str, path: Path | None, overrides: dict[str, object]) -> RoleConfig:
    """The role's configuration from ``path`` (YAML, optional) with flag ``overrides`` applied.

    Errors:
        :class:`ConfigError` naming the file and the offending field.
    """
    config_type = ROLE_CONFIGS[role]
    where = str(path) if path else "flags"
    try:
        raw: object = nesting.load_yaml(path.read_bytes(), unique_keys=True) if path else {}
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except (nesting.NestingError, nesting.DuplicateKeyError) as exc:
        raise ConfigError(f"config {path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {' '.join(str(exc).split())}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping of options, not {type(raw).__name__}")
    merged = {**raw, **{k: v for k, v in overrides.items() if v is not None}}
    try:
        return msgspec.convert(merged, type=config_type)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid {role} config ({where}): {exc}") from None
