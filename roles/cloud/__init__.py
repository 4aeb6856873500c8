"""The cloud role: the websocket hub edge agents connect to.

:mod:`roles.cloud.role` wires it (``run``); :mod:`roles.cloud.hub` is the hub itself, composing its
rooms: :mod:`~roles.cloud.transport` (how edges reach it), :mod:`~roles.cloud.jobs` (node jobs),
:mod:`~roles.cloud.tasks` (diagnosis Tasks), :mod:`~roles.cloud.cache` (the edges' cache streams) and
:mod:`~roles.cloud.nodes` (what it writes on Nodes). The modules at this level are the hub's core,
which every room may import: what it asks of the API server (``api``), its sessions, settings and
metrics, and the pure status changes of a job (``changes``). Importing one of its modules loads only
what that module needs, not the whole role.
"""
