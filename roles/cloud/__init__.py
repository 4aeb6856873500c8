"""The cloud role."""

from __future__ import annotations

import structlog

from roles.config import RoleConfig


async def run(cfg: RoleConfig, *, log: structlog.typing.FilteringBoundLogger) -> None:
    """Run the cloud role until cancelled."""
    raise NotImplementedError("the cloud role is not implemented yet")
