"""Ports the provisioning scripts pick for servers that start later stay out of the kernel's ephemeral range."""

from __future__ import annotations

import socket

from tools.provision.controlplane import _ephemeral_floor, _free_ports


def test_chosen_ports_are_distinct_free_and_below_the_range_the_kernel_hands_out_itself() -> None:
    """No outgoing connection can take a chosen port before its server binds it, and each can be bound."""
    ports = _free_ports(6)
    assert len(set(ports)) == 6
    assert all(port < _ephemeral_floor() for port in ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
