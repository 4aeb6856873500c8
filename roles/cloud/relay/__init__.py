"""The relay: devices' tunnels to the API server, carried through their sessions.

A device whose kubelet talks to the cluster through its agent reaches the API server only through
its hub; :mod:`.api_relay` connects each tunnel the device opens to the API server and passes its
bytes, TLS the hub cannot read. It may import the hub's core (sessions, settings, metrics) and
nothing else of the role.
"""
