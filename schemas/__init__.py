"""API types: the ``operations.kubeedge.io`` node jobs, their generated CRDs, and KubeDiag's kinds (:mod:`.diagnosis`).

msgspec Structs and the pure rules that read them (validation, defaulting). Imports :mod:`nodetask` only.
"""
