"""The edge's container runtime: image pulls through CRI (:mod:`.cri`), run in a child process (:mod:`.puller`).

Nothing is imported here on purpose: importing :mod:`.cri` loads grpcio and protobuf, which only
the puller's child process should pay for.
"""
