"""The agent's state as its metrics show it (:mod:`roles.edge.metrics`): numbers only, read at one moment."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec


class Observed(msgspec.Struct, frozen=True, kw_only=True):
    """What :meth:`roles.edge.agent.EdgeAgent.observe` read."""

    tasks: Mapping[str, int]
    """Node tasks on this device by state (``running``, ``waiting_confirmation``, ``finished`` until pruned)."""
    outbox_depth: int
    """Reports not yet acknowledged by a hub."""
    reports_dropped: int
    """Reports the hubs refused for good, kept on record."""
    store_bytes: int
    store_problem: str
    """Why the store could not be read ("" when it could; the store's counts are then 0)."""
    connected: bool
    """Whether a hub session is up."""
    sessions: int
    """Hub sessions welcomed since the agent started: each reconnect is one more."""
    error_keys: int
    """Cached objects the cache could not keep (the ledger's error keys)."""
    ledger_persisted: bool
    autonomy_requested: bool
    autonomy_condition: str
    """The Autonomy condition's status (``True``, ``False``, ``Unknown``), "" before the first check."""


__all__ = ["Observed"]
