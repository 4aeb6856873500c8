"""The edge role."""

from __future__ import annotations

import structlog

from roles.config import RoleConfig


async def run(cfg: RoleConfig, *, log: structlog.typing.FilteringBoundLogger) -> None:
    """Run the edge role until cancelled."""
    raise NotImplementedError("the edge role is not implemented yet")
