"""Diagnosis processors: what a Task (``diagnosis.kubediag.org/v1``) runs on the device.

:func:`run` takes the Operation's processor and the Task's request data and returns a
:class:`ProcessorOutcome`; it never raises for anything the processor or its target did. Each kind
lives in its own module, imported when first used: an agent that never runs a diagnosis does not
pay for the HTTP client, the script runner or the collectors (the idle agent's memory budget).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from roles.config import DiagnosisConfig
from schemas.diagnosis import Processor

__all__ = ["ProcessorEnv", "ProcessorOutcome"]


@dataclass(frozen=True, slots=True)
class ProcessorOutcome:
    """A processor's verdict: its results on success, why it failed otherwise."""

    succeeded: bool
    results: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ProcessorEnv:
    """What processors may use of the device and the agent."""

    node: str
    config: DiagnosisConfig
    cri_endpoint: str
    agent_status: Callable[[], Awaitable[Mapping[str, str]]]
    """The agent's own state for the ``agent.status`` collector (version, store health, outbox depth, hub)."""


async def run(processor: Processor, request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    """Run ``processor`` on ``request`` within its ``timeoutSeconds``."""
    raise NotImplementedError
