"""The ``network.probe`` collector: resolve and TCP-connect to the targets a Task names, with timings.

An unreachable target is a finding, not an error: each target gets its own results. Whether the
Task succeeds is the request's ``network.probe.require``: ``all`` (the default: every target must
answer, so a diagnosis path that depends on a service fails over to the next one when it does not),
``any`` (at least one), or ``none`` (a pure measurement, success whatever was found).

What a probe may reach is the device's (:mod:`.reach`): the device itself only at the ports of
``diagnosis.loopbackPorts``, other hosts only if ``diagnosis.probeHosts`` lists them. A Task naming
any other target fails before a single name is resolved or a connection made, naming the targets
and the settings; a listed name that resolves to the device gets the device's rules.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import anyio

from roles.edge.processors.outcome import ProcessorOutcome, failed
from roles.edge.processors.reach import Reach, address_refusal, host_refusal
from roles.edge.processors.request_keys import RequestError, choice_key, int_key, required_key

__all__ = ["Probe", "parse_targets", "probe_outcome", "refused_targets", "run_probe"]

TARGETS_KEY: Final = "network.probe.targets"
TIMEOUT_KEY: Final = "network.probe.timeoutSeconds"
REQUIRE_KEY: Final = "network.probe.require"
MAX_TARGETS: Final = 32
_PREFIX: Final = "network.probe"


def parse_targets(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,[v6]:port,...`` as (host, port) pairs, in order, without repeats.

    Errors: :class:`RequestError` naming ``network.probe.targets`` and the bad entry.
    """
    targets: list[tuple[str, int]] = []
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        host, sep, port = entry.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        elif ":" in host:
            sep = ""  # an IPv6 address without brackets: its port cannot be told apart
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise RequestError(f"{TARGETS_KEY}: {entry[:80]!r} is not host:port (an IPv6 address as [addr]:port)")
        if (host, int(port)) not in targets:
            targets.append((host, int(port)))
    if not targets:
        raise RequestError(f"{TARGETS_KEY} names no target")
    if len(targets) > MAX_TARGETS:
        raise RequestError(f"{TARGETS_KEY} names {len(targets)} targets; at most {MAX_TARGETS} are probed")
    return tuple(targets)


@dataclass(frozen=True, slots=True)
class Probe:
    """What was found of one target."""

    target: str
    addresses: tuple[str, ...] = ()
    dns_ms: float | None = None
    connect_ms: float | None = None
    error: str = ""

    @property
    def reachable(self) -> bool:
        return self.connect_ms is not None and not self.error


def _label(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def probe_outcome(probes: tuple[Probe, ...], require: str) -> ProcessorOutcome:
    """The results of ``probes`` (documented keys), succeeded as ``require`` (all, any, none) says."""
    results: dict[str, str] = {}
    for p in probes:
        key = f"{_PREFIX}.{p.target}"
        results[f"{key}.result"] = "ok" if p.reachable else p.error
        results[f"{key}.addresses"] = ",".join(p.addresses)
        if p.dns_ms is not None:
            results[f"{key}.dnsMs"] = f"{p.dns_ms:.1f}"
        if p.connect_ms is not None:
            results[f"{key}.connectMs"] = f"{p.connect_ms:.1f}"
    reachable = sum(p.reachable for p in probes)
    results[f"{_PREFIX}.reachable"] = f"{reachable}/{len(probes)}"
    ok = {"all": reachable == len(probes), "any": reachable > 0, "none": True}[require]
    if ok:
        return ProcessorOutcome(succeeded=True, results=results)
    down = "; ".join(f"{p.target}: {p.error}" for p in probes if not p.reachable)
    return ProcessorOutcome(
        succeeded=False,
        results=results,
        reason=f"{reachable} of {len(probes)} targets answered ({REQUIRE_KEY} is {require}): {down}",
    )


def _error(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return f"name not resolved: {exc.strerror or exc}"
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror.lower().split(": ")[-1]
    return (exc.strerror or str(exc)).lower()


def refused_targets(targets: tuple[tuple[str, int], ...], reach: Reach) -> str | None:
    """Why some of ``targets`` may not be probed (each named, with the setting that would allow it), or None."""
    refusals = [
        f"{_label(host, port)}: {why}" for host, port in targets if (why := host_refusal(host, port, reach)) is not None
    ]
    if not refusals:
        return None
    noun = "target" if len(refusals) == 1 else "targets"
    return f"{TARGETS_KEY} names {len(refusals)} {noun} this device does not allow: {'; '.join(refusals)}"


async def _probe(host: str, port: int, limit_s: float, reach: Reach) -> Probe:
    target = _label(host, port)
    addresses: tuple[str, ...] = ()
    dns_ms: float | None = None
    started = anyio.current_time()
    with anyio.move_on_after(limit_s):
        try:
            infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            return Probe(target=target, error=_error(exc))
        resolved = anyio.current_time()
        addresses = tuple(dict.fromkeys(str(info[4][0]) for info in infos))
        dns_ms = (resolved - started) * 1000
        refusal = next((why for a in addresses if (why := address_refusal(host, a, port, reach)) is not None), None)
        if refusal is not None:
            return Probe(target=target, addresses=addresses, dns_ms=dns_ms, error=f"refused: {refusal}")
        try:
            stream = await anyio.connect_tcp(addresses[0], port)
        except OSError as exc:
            return Probe(target=target, addresses=addresses, dns_ms=dns_ms, error=f"connect failed: {_error(exc)}")
        connect_ms = (anyio.current_time() - resolved) * 1000
        await stream.aclose()
        return Probe(target=target, addresses=addresses, dns_ms=dns_ms, connect_ms=connect_ms)
    step = "connect" if dns_ms is not None else "name resolution"
    return Probe(
        target=target,
        addresses=addresses,
        dns_ms=dns_ms,
        error=f"{step}: no answer within {limit_s:g} s ({TIMEOUT_KEY})",
    )


async def run_probe(request: Mapping[str, str], reach: Reach) -> ProcessorOutcome:
    """Probe the request's targets concurrently, if ``reach`` allows every one of them.

    Errors: :class:`RequestError` for bad request keys.
    """
    targets = parse_targets(required_key(request, TARGETS_KEY))
    timeout = int_key(request, TIMEOUT_KEY, default=3, low=1, high=60)
    require = choice_key(request, REQUIRE_KEY, ("all", "any", "none"))
    if (why := refused_targets(targets, reach)) is not None:
        return failed(why)
    probes: list[Probe | None] = [None] * len(targets)

    async def one(index: int, host: str, port: int) -> None:
        probes[index] = await _probe(host, port, timeout, reach)

    async with anyio.create_task_group() as tg:
        for index, (host, port) in enumerate(targets):
            tg.start_soon(one, index, host, port)
    return probe_outcome(tuple(p for p in probes if p is not None), require)
