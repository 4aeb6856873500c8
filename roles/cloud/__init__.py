"""The cloud role: the websocket hub edge agents connect to.

:mod:`roles.cloud.role` wires it (``run``); :mod:`roles.cloud.hub` is the hub itself. Importing one of
its modules loads only what that module needs, not the whole role.
"""
