"""How edges reach the hub: the front door (TCP, TLS, websocket handshake, bearer tokens), the
websocket server and its frames, and an admitted edge's session from Hello to close; KubeEdge's
HTTP report endpoint too.

It hands what the edges say to the rooms behind it: it may import :mod:`roles.cloud.cache` (a
session's cache stream), :mod:`roles.cloud.nodes` (the Autonomy condition) and :mod:`roles.cloud.jobs`
(reports over HTTP), besides the hub's core modules (``api``, ``sessions``, ``settings``, ``metrics``);
never :mod:`roles.cloud.hub`, which wires it.
"""
