"""The agent's durable store: one SQLite file holding what must survive a restart, a reboot or an upgrade.

:mod:`.store` is the store the agent uses (:class:`~roles.edge.store.store.EdgeStore`); the file, its schema
and migrations are :mod:`.schema`'s, and each group of tables has its own module of plain functions
over an open connection. It imports nothing else of the edge: everything above stands on it.
"""
