"""Whether a restarted kubelet has come back, judged from the Node it posts: a pure decision for the device.

A kubelet upgrade (and its rollback) restarts the node's kubelet; it is healthy once its ``healthz`` answers
and its Node says Ready with the expected ``kubeletVersion`` in a status it posted after the restart (a
Ready written before the restart proves nothing about the kubelet now running).
"""

from __future__ import annotations

from datetime import datetime

from nodetask.clock import parse_time
from schemas.core import Node

__all__ = ["node_problem"]


def node_problem(node: Node | None, *, version: str, since: datetime) -> str:
    """Why ``node`` does not (yet) show a healthy kubelet at ``version`` posting since ``since``; "" when it does.

    ``lastHeartbeatTime`` has whole seconds, so one in ``since``'s second counts: a restart begins on a whole
    second (:func:`roles.edge.kubelet.probe.restart_and_prove`), and a kubelet posts its status once as it starts,
    then only on a change or every five minutes; requiring a later second would miss a quick one for good."""
    if node is None:
        return "the device holds no Node object of its own"
    info = node.status.node_info
    running = info.kubelet_version if info is not None else ""
    if running != version:
        return f"the Node reports kubelet version {running or '(none)'}, not {version}"
    ready = next((c for c in node.status.conditions if c.type == "Ready"), None)
    if ready is None or ready.status != "True":
        said = ": ".join(part for part in (ready.reason, ready.message) if part) if ready is not None else ""
        return f"the Node is not Ready ({said})" if said else "the Node is not Ready"
    try:
        beat = parse_time(ready.last_heartbeat_time or "")
    except ValueError:
        return "the Node's Ready condition has no heartbeat time"
    if beat < since.replace(microsecond=0):
        return "the kubelet has not posted its Node's status since it was restarted"
    return ""
