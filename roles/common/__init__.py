"""What the roles share: their configuration, the HTTP server, TLS, Events, files, logs and restarts.

Nothing here knows a role: it may import the shared core (``nodetask``), the API types and the kube
client, never ``roles.controller``, ``roles.cloud`` or ``roles.edge``. The modules an edge device loads
(configuration, HTTP server, files, logs) need only the base install.
"""
