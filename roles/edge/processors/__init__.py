"""Diagnosis processors: what a Task (``diagnosis.kubediag.org/v1``) runs on the device.

:func:`run` takes the Operation's processor and the Task's request data and returns a
:class:`ProcessorOutcome`; it never raises for anything the processor or its target did. Each kind
lives in its own module, imported when first used: an agent that never runs a diagnosis does not
pay for the HTTP client, the script runner or the collectors (the idle agent's memory budget).

- :mod:`.http`: ``httpServer`` (KubeDiag's contract; the device's ports only if
  ``diagnosis.loopbackPorts`` lists them, other hosts only if ``diagnosis.httpHosts`` does: :mod:`.reach`).
- :mod:`.scripts`: ``scriptRunner`` (off unless ``diagnosis.scripts.enabled``, then only listed
  SHA-256s unless ``allowAny``; argv, never a shell string; the process group dies with the run).
- :mod:`.builtins`: ``builtin`` collectors (``node.resources``, ``node.processes``,
  ``containers.list``, ``images.list``, ``network.probe``, ``file.tail``, ``agent.status``); their
  request keys and results are tabled there.

Every successful outcome's results are bounded (:func:`.outcome.bounded`): each value clipped to
64 Ki characters, all of them together at most 256 Ki characters, or the Task fails saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import anyio

from roles.edge.processors.env import ProcessorEnv
from roles.edge.processors.outcome import ProcessorOutcome, bounded, failed
from schemas.processors import Processor

__all__ = ["ProcessorEnv", "ProcessorOutcome", "kind_of", "run"]

Kind = Literal["httpServer", "scriptRunner", "builtin"]


def kind_of(processor: Processor) -> Kind | str:
    """The processor's kind, or (any other string) why it has none this device can run."""
    kinds: list[Kind] = []
    if processor.http_server is not None:
        kinds.append("httpServer")
    if processor.script_runner is not None:
        kinds.append("scriptRunner")
    if processor.builtin is not None:
        kinds.append("builtin")
    if processor.function is not None:
        return "the function processor (images built with Docker on the node) is not supported"
    if not kinds:
        return "the processor names none of httpServer, scriptRunner and builtin"
    if len(kinds) > 1:
        return f"the processor names {' and '.join(kinds)}; exactly one is allowed"
    return kinds[0]


async def run(processor: Processor, request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    """Run ``processor`` on ``request`` within its ``timeoutSeconds``.

    Errors: none for what the processor or its target did; a failure's ``reason`` says what happened.
    Cancellation: the caller's cancellation propagates after the processor has stopped (a script's
    processes are killed and reaped first).
    """
    kind = kind_of(processor)
    if kind not in ("httpServer", "scriptRunner", "builtin"):
        return failed(kind)
    timeout = processor.timeout_seconds
    deadline = anyio.current_time() + timeout
    with anyio.CancelScope(deadline=deadline) as scope:
        outcome = await _dispatch(kind, processor, request, env, deadline=deadline)
    if scope.cancelled_caught:
        return failed(f"timed out after {timeout} s (the operation's timeoutSeconds)")
    return bounded(outcome)


async def _dispatch(
    kind: str, processor: Processor, request: Mapping[str, str], env: ProcessorEnv, *, deadline: float
) -> ProcessorOutcome:
    # Each kind is imported here, on first use, not with the package: the agent imports this
    # package at start, and an idle agent must stay within its 40 MiB budget.
    if kind == "httpServer" and processor.http_server is not None:
        from roles.edge.processors import http, reach  # noqa: PLC0415 (deferred on purpose)

        allowed = reach.reach_of(env.config, own_ports=env.own_ports, hosts="http")
        return await http.run_http(processor.http_server, request, allowed, deadline=deadline, log=env.logger)
    if kind == "scriptRunner" and processor.script_runner is not None:
        from roles.edge.processors import scripts  # noqa: PLC0415 (deferred on purpose)

        return await scripts.run_script(
            processor.script_runner, request, env.config.scripts, data_dir=env.data_dir, log=env.logger
        )
    assert processor.builtin is not None  # kind_of said so
    from roles.edge.processors import builtins  # noqa: PLC0415 (deferred on purpose)

    return await builtins.run_builtin(processor.builtin.name, request, env)
