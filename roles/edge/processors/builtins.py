"""The ``builtin`` processor: nodetaskd's in-process collectors, by name (``schemas.diagnosis.v1.BUILTIN_PROCESSORS``).

Each collector's module is imported when a Task first names it (psutil, the CRI child's protocol),
not with the agent. Results are flat strings under keys that start with the collector's name;
lists are JSON arrays kept whole (as many items as fit in one result value, with a ``.shown`` count).

=================== ============================================ ==============================================
collector           request keys it reads                        results
=================== ============================================ ==============================================
``node.resources``  none                                         ``node.resources.cpu.count``, ``.cpu.percent``
                                                                 (over 0.5 s), ``.load`` (1, 5, 15 min),
                                                                 ``.memory.total``/``.available`` (bytes),
                                                                 ``.memory.percent``, ``.uptime.seconds``,
                                                                 ``.disks`` (JSON: mountpoint, device, fstype,
                                                                 totalBytes, usedBytes, freeBytes, percent),
                                                                 ``.disks.count``
``node.processes``  ``node.processes.top`` (1-50, default 5)     ``node.processes.count``, ``.top.cpu`` and
                                                                 ``.top.memory`` (JSON: pid, name, user,
                                                                 cpuPercent over 0.5 s, rssBytes)
``containers.list`` none                                         ``containers.list.count``, ``.running``,
                                                                 ``.items`` (JSON: id, name, state, image, pod,
                                                                 namespace, attempt), ``.shown``
``images.list``     none                                         ``images.list.count``, ``.bytes``, ``.items``
                                                                 (JSON: id, tags, size), ``.shown``
``network.probe``   ``network.probe.targets`` (``host:port,...``,  per target ``network.probe.<target>.result``
                    required; the device's ports only if         (``ok`` or what failed), ``.addresses``,
                    ``diagnosis.loopbackPorts`` lists them,      ``.dnsMs``, ``.connectMs``; and
                    other hosts only if ``diagnosis.probeHosts`` ``network.probe.reachable`` (``n/m``)
                    does), ``.timeoutSeconds`` (1-60, default
                    3), ``.require`` (``all``, ``any``,
                    ``none``; default ``all``)
``file.tail``       ``file.tail.path`` (required, absolute,      ``file.tail.path`` (resolved), ``.size``,
                    under ``diagnosis.tailDirs``, one hard       ``.lineCount``, ``.content``
                    link), ``file.tail.lines`` (1-10000,
                    default 100)
``agent.status``    none                                         ``agent.status.<key>`` for each of the agent's
                                                                 own (version, store health, outbox depth, hub)
=================== ============================================ ==============================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Final

from roles.edge.processors.env import ProcessorEnv
from roles.edge.processors.outcome import ProcessorOutcome, failed
from roles.edge.processors.request_keys import RequestError
from schemas.processors import BUILTIN_PROCESSORS

__all__ = ["run_builtin"]


async def run_builtin(name: str, request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    """Run the collector ``name`` on ``request``; a bad request key is a failure naming it."""
    collector = _COLLECTORS.get(name)
    if collector is None:
        return failed(f"builtin.name {name!r} is not one of {', '.join(BUILTIN_PROCESSORS)}")
    try:
        return await collector(request, env)
    except RequestError as exc:
        return failed(f"{name}: {exc}")


# Each collector imports its module when first called, not with the agent: the idle agent's budget.
# ruff: noqa: PLC0415


async def _node_resources(request: Mapping[str, str], _: ProcessorEnv) -> ProcessorOutcome:
    from roles.edge.processors import node_collectors

    return ProcessorOutcome(succeeded=True, results=await node_collectors.node_resources(request))


async def _node_processes(request: Mapping[str, str], _: ProcessorEnv) -> ProcessorOutcome:
    from roles.edge.processors import node_collectors

    return ProcessorOutcome(succeeded=True, results=await node_collectors.node_processes(request))


async def _containers(_: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    from roles.edge.processors import runtime_lists

    return await runtime_lists.run_list("containers", env)


async def _images(_: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    from roles.edge.processors import runtime_lists

    return await runtime_lists.run_list("images", env)


async def _network_probe(request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    from roles.edge.processors import probe, reach

    return await probe.run_probe(request, reach.reach_of(env.config, own_ports=env.own_ports, hosts="probe"))


async def _file_tail(request: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    from roles.edge.processors import tail

    return await tail.run_tail(request, env.config.tail_dirs)


async def _agent_status(_: Mapping[str, str], env: ProcessorEnv) -> ProcessorOutcome:
    status = await env.agent_status()
    return ProcessorOutcome(succeeded=True, results={f"agent.status.{k}": v for k, v in status.items()})


Collector = Callable[[Mapping[str, str], ProcessorEnv], Awaitable[ProcessorOutcome]]

_COLLECTORS: Final[Mapping[str, Collector]] = MappingProxyType(
    {
        "node.resources": _node_resources,
        "node.processes": _node_processes,
        "containers.list": _containers,
        "images.list": _images,
        "network.probe": _network_probe,
        "file.tail": _file_tail,
        "agent.status": _agent_status,
    }
)
