"""``nodetaskd edge status``: the running agent's state, asked over its control socket on the device.

The agent answers ``status`` with one JSON line (:mod:`roles.edge.control`): its version and node, its hub
session, and the counts its metrics show (:class:`roles.edge.observed.Observed`). This module asks and
renders; nothing here reads the agent's store, which is the agent's alone while it runs.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Final

import msgspec

ANSWER_LIMIT: Final = 1 << 16
TIMEOUT_S: Final = 10.0


class AgentUnreachable(OSError):
    """No agent answered on the control socket."""


def ask(path: Path) -> dict[str, Any]:
    """The agent's status, from its control socket at ``path``.

    Errors: :class:`AgentUnreachable` naming the socket and why; ValueError for an answer that is no status."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(TIMEOUT_S)
            conn.connect(str(path))
            conn.sendall(b"status\n")
            answer = b""
            while not answer.endswith(b"\n") and len(answer) < ANSWER_LIMIT:
                chunk = conn.recv(ANSWER_LIMIT)
                if not chunk:
                    break
                answer += chunk
    except OSError as exc:
        raise AgentUnreachable(f"cannot reach the edge agent at {path}: {exc.strerror or exc}") from None
    if answer.startswith(b"error:"):
        raise ValueError(f"the agent at {path} does not know status (an older version?): {answer.decode().strip()}")
    try:
        found: dict[str, Any] = msgspec.json.decode(answer)
    except msgspec.DecodeError as exc:
        raise ValueError(f"the agent at {path} answered no status: {exc}") from None
    return found


def render(status: dict[str, Any]) -> str:
    """The status as aligned lines, one subject each."""
    seen: dict[str, Any] = status.get("observed", {})
    tasks = seen.get("tasks", {})
    connected = status.get("connected") == "true"
    hub = f"{status.get('hub') or '(none)'}, {'connected' if connected else 'not connected'}"
    store = "ok" if not seen.get("store_problem") else f"cannot be read: {seen['store_problem']}"
    condition = seen.get("autonomy_condition") or "(not checked yet)"
    by_state = ", ".join(f"{state} {tasks.get(state, 0)}" for state in ("running", "waiting_confirmation", "finished"))
    outbox = seen.get("outbox_depth", 0)
    ledger = "persisted" if seen.get("ledger_persisted") else "NOT persisted"
    requested = "requested" if seen.get("autonomy_requested") else "not requested"
    lines = [
        ("Node", status.get("node", "")),
        ("Version", status.get("version", "")),
        ("Hub", f"{hub} ({seen.get('sessions', 0)} sessions since the agent started)"),
        ("Tasks", by_state),
        ("Outbox", f"{outbox} reports not yet acknowledged, {seen.get('reports_dropped', 0)} refused for good"),
        ("Store", f"{store}, {seen.get('store_bytes', 0) / (1 << 20):.1f} MiB"),
        ("Cache", f"{seen.get('error_keys', 0)} error keys, ledger {ledger}"),
        ("Autonomy", f"{requested}; condition {condition}"),
    ]
    return "".join(f"{name + ':':<10}{value}\n" for name, value in lines)


__all__ = ["AgentUnreachable", "ask", "render"]
