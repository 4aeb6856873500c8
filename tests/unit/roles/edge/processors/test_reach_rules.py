"""The rules of where a Task may make the device connect (:mod:`roles.edge.processors.reach`), over any input."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from roles.edge.processors.reach import Reach, address_refusal, host_refusal

NO_HOSTS = Reach(hosts=(), hosts_setting="diagnosis.httpHosts")
device_addresses = st.one_of(
    st.ip_addresses(v=4, network="127.0.0.0/8").map(str),
    st.ip_addresses(v=4, network="127.0.0.0/8").map(lambda a: f"::ffff:{a}"),
    st.sampled_from(["::1", "localhost", "LocalHost.", "0.0.0.0", "::", "[::1]"]),
)
ports = st.integers(min_value=1, max_value=65535)
other_v4 = st.ip_addresses(v=4).filter(lambda a: not (a.is_loopback or a.is_unspecified)).map(str)


@given(device_addresses, ports, st.lists(ports, max_size=3), st.lists(ports, max_size=2))
def test_the_device_is_reachable_only_at_listed_ports_that_are_not_the_agents(
    host: str, port: int, listed: list[int], own: list[int]
) -> None:
    """Loopback, ::1, localhost, 0.0.0.0, :: and IPv4-mapped loopback: listed ports only, the agent's never."""
    reach = Reach((host,), "diagnosis.httpHosts", loopback_ports=tuple(listed), own_ports=tuple(own))
    why = host_refusal(host, port, reach)
    assert (why is None) == (port in listed and port not in own)
    if port in own:
        assert why is not None
        assert "localApi.port" in why
    elif why is not None:
        assert "diagnosis.loopbackPorts" in why


@given(other_v4, ports, st.lists(other_v4, max_size=3))
def test_another_address_is_reachable_at_any_port_exactly_when_listed(
    address: str, port: int, listed: list[str]
) -> None:
    """A host besides the device needs its list (named in the refusal), not loopbackPorts."""
    reach = Reach(hosts=tuple(listed), hosts_setting="diagnosis.probeHosts", loopback_ports=(port,))
    why = host_refusal(address, port, reach)
    assert (why is None) == (address in listed)
    assert why is None or "diagnosis.probeHosts" in why


def test_names_match_listed_names_without_case_or_trailing_dot() -> None:
    """Host names compare as DNS does: case-insensitive, a trailing dot ignored; no suffix matches."""
    reach = Reach(hosts=("metrics.example.com",), hosts_setting="diagnosis.httpHosts")
    assert host_refusal("Metrics.Example.com.", 443, reach) is None
    assert host_refusal("metrics.example.com.evil", 443, reach) is not None
    assert host_refusal("evil.metrics.example.com", 443, reach) is not None


@given(st.sampled_from(["127.0.0.1", "127.5.6.7", "::1", "0.0.0.0", "::", "::ffff:127.0.0.1"]), ports)
def test_a_resolved_address_of_the_device_needs_a_listed_port(address: str, port: int) -> None:
    """What a listed name resolves to is judged again: the device's addresses get the device's rules."""
    assert address_refusal("app.example", address, port, NO_HOSTS) is not None
    assert address_refusal("app.example", address, port, Reach((), "x", loopback_ports=(port,))) is None
    assert address_refusal("app.example", "192.0.2.7", port, NO_HOSTS) is None
