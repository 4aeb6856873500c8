"""A ProcessorEnv for processor tests, with a log whose events the test can read and wait for."""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import structlog
import structlog.testing
import trio

from roles.common.config import DiagnosisConfig
from roles.edge.processors import ProcessorEnv


class Events:
    """The log events a test has seen, and an event per event name to wait for."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self._waiting: dict[str, trio.Event] = {}

    def __call__(self, _logger: object, _method: str, event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
        self.seen.append(dict(event_dict))
        self.event(str(event_dict["event"])).set()
        raise structlog.DropEvent

    def event(self, name: str) -> trio.Event:
        return self._waiting.setdefault(name, trio.Event())

    def named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.seen if e["event"] == name]


def make_env(
    events: Events | None = None,
    *,
    config: DiagnosisConfig | None = None,
    data_dir: Path | None = None,
    cri_endpoint: str = "unix:///nonexistent/containerd.sock",
    agent_status: Mapping[str, str] | None = None,
    loopback_ports: tuple[int, ...] = (),
    own_ports: tuple[int, ...] = (),
) -> ProcessorEnv:
    """An env whose log goes to ``events`` (dropped if None); ``loopback_ports`` are added to ``config``'s."""
    wrapper = structlog.make_filtering_bound_logger(logging.DEBUG)
    processors: list[Any] = [events] if events is not None else [_drop]
    log: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(
        structlog.testing.CapturingLogger(), wrapper_class=wrapper, processors=processors
    )
    status = dict(agent_status or {})

    async def get_status() -> Mapping[str, str]:
        return status

    config = config or DiagnosisConfig()
    if loopback_ports:
        config = msgspec.structs.replace(config, loopback_ports=(*config.loopback_ports, *loopback_ports))
    return ProcessorEnv(
        node="edge-1",
        config=config,
        cri_endpoint=cri_endpoint,
        agent_status=get_status,
        data_dir=data_dir,
        own_ports=own_ports,
        log=log,
    )


def _drop(_logger: object, _method: str, _event_dict: MutableMapping[str, Any]) -> Mapping[str, Any]:
    raise structlog.DropEvent
