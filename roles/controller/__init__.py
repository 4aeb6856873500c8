"""The controller role."""

from __future__ import annotations

import structlog

from roles.config import RoleConfig


async def run(cfg: RoleConfig, *, log: structlog.typing.FilteringBoundLogger) -> None:
    """Run the controller role until cancelled."""
    raise NotImplementedError("the controller role is not implemented yet")
