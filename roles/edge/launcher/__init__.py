"""The launcher: the device's supervisor of the agent, which rolls back an upgrade that does not prove itself.

``python -m roles.edge.launcher`` starts it (:mod:`.__main__`); :mod:`.launcher` runs the pure rules of
:mod:`.supervision`. It runs as long as the device does, so it loads nothing of the agent, its store or its
actions: of the edge only the files it shares with the agent (:mod:`roles.edge.upgrade.marker`,
:mod:`roles.edge.config_update.pending`).
"""
