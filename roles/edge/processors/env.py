"""What processors are given of the device and the agent."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from roles.common.config import DiagnosisConfig

__all__ = ["Log", "ProcessorEnv"]

Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True, slots=True)
class ProcessorEnv:
    """What processors may use of the device and the agent."""

    node: str
    config: DiagnosisConfig
    cri_endpoint: str
    agent_status: Callable[[], Awaitable[Mapping[str, str]]]
    """The agent's own state for the ``agent.status`` collector (version, store health, outbox depth, hub)."""
    data_dir: Path | None = None
    """The agent's data directory: scripts are written under it (``diagnosis-scripts/``); None: the
    system's temporary directory."""
    own_ports: tuple[int, ...] = ()
    """The TCP ports the agent itself serves on the device (``EdgeConfig.served_ports``): no Task may
    reach them, whatever ``diagnosis.loopbackPorts`` lists."""
    log: Log | None = None
    """Where processors log (bound with the Task's keys); None: structlog's default logger."""
    log_level: str = "info"
    log_format: str = "console"
    """How the CRI child process (``containers.list``, ``images.list``) logs: the agent's settings."""

    @property
    def logger(self) -> Log:
        if self.log is not None:
            return self.log
        logger: Log = structlog.get_logger()
        return logger
