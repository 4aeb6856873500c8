"""API types of KubeDiag's ``diagnosis.kubediag.org/v1`` kinds: the types, their kinds, the graph rules, admission.

:mod:`.v1` holds the types, :mod:`.kinds` describes each kind as :mod:`schemas.kinds` does the jobs',
:mod:`.graph` is an OperationSet's graph rules and :mod:`.validation` the admission rules. Imports
the rest of :mod:`schemas` and :mod:`nodetask` only.
"""
