"""Where a Task may make the device connect: the ``httpServer`` processor and the ``network.probe`` collector.

Closed by default. The device's own addresses (loopback, and the unspecified ``0.0.0.0`` and ``::``,
which the kernel takes for the device) are reachable only at the ports ``diagnosis.loopbackPorts``
lists: that is where etcd, an API server or a hub listen on a device that runs them, and a Task
could otherwise find them (a probe) or write to them (a POST). The ports the agent itself serves
(the local API) are refused even when listed. Any other host is reachable only if its own list
names it (``diagnosis.httpHosts`` for POSTs, ``diagnosis.probeHosts`` for probes); a name nobody
listed is never even resolved, so that a probe is not a DNS oracle either. A listed name is checked
again on every address it resolves to: a name that resolves to the device gets the loopback rules.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final, Literal

from roles.common.config import DiagnosisConfig

__all__ = ["LOOPBACK_PORTS_SETTING", "Reach", "address_refusal", "host_refusal", "reach_of", "reaches_device"]

LOOPBACK_PORTS_SETTING: Final = "diagnosis.loopbackPorts"
_LOCAL_NAMES: Final = frozenset({"localhost"})

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Reach:
    """What a processor may connect to on this device's behalf."""

    hosts: tuple[str, ...]
    """Hosts besides the device (names or addresses, as the config spells them)."""
    hosts_setting: str
    """The setting that lists :attr:`hosts`, for refusals (``diagnosis.httpHosts``)."""
    loopback_ports: tuple[int, ...] = ()
    """The device's ports a Task may reach (``diagnosis.loopbackPorts``)."""
    own_ports: tuple[int, ...] = ()
    """The ports the agent itself serves (``localApi.port`` when on): never reachable."""


def reach_of(config: DiagnosisConfig, *, own_ports: tuple[int, ...], hosts: Literal["http", "probe"]) -> Reach:
    """What the ``httpServer`` processor (``http``) or ``network.probe`` (``probe``) may reach under ``config``."""
    listed = config.http_hosts if hosts == "http" else config.probe_hosts
    return Reach(
        hosts=listed,
        hosts_setting=f"diagnosis.{hosts}Hosts",
        loopback_ports=config.loopback_ports,
        own_ports=own_ports,
    )


def normal_host(host: str) -> str:
    """``host`` as DNS compares names: no brackets, no trailing dot, lower case."""
    return host.strip().strip("[]").rstrip(".").lower()


def _address(text: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1 on a dual-stack socket
    return address


def reaches_device(address: str) -> bool:
    """Whether a connection to the IP address ``address`` lands on this device itself."""
    found = _address(address)
    return found is not None and (found.is_loopback or found.is_unspecified)


def _port_refusal(shown: str, port: int, reach: Reach) -> str | None:
    if port in reach.own_ports:
        return f"{shown} port {port} is served by the agent itself (localApi.port): no Task may reach it"
    if port not in reach.loopback_ports:
        return f"{shown} port {port} is not in {LOOPBACK_PORTS_SETTING} of this device's config"
    return None


def host_refusal(host: str, port: int, reach: Reach) -> str | None:
    """Why ``host``:``port`` may not be resolved or connected to, naming the setting that would allow it; None
    if it may (a listed name's addresses still go through :func:`address_refusal`)."""
    name = normal_host(host)
    address = _address(name)
    if name in _LOCAL_NAMES or (address is not None and (address.is_loopback or address.is_unspecified)):
        return _port_refusal(f"{host!r} is the device itself, and its", port, reach)
    for entry in reach.hosts:
        listed = normal_host(entry)
        if listed == name or (address is not None and _address(listed) == address):
            return None
    return f"{host!r} is not the device itself, and {reach.hosts_setting} of this device's config does not list it"


def address_refusal(host: str, address: str, port: int, reach: Reach) -> str | None:
    """Why ``host``, which resolved to ``address``, may not be connected to at ``port``; None if it may."""
    if not reaches_device(address):
        return None
    if _address(normal_host(host)) is not None or normal_host(host) in _LOCAL_NAMES:
        return _port_refusal(f"{host!r} is the device itself, and its", port, reach)
    return _port_refusal(f"{host!r} resolves to the device itself ({address}), and its", port, reach)
