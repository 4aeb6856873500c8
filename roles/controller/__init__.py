"""The controller role: watches the jobs and diagnoses, picks their nodes, computes their phases, validates them.

:mod:`roles.controller.role` wires it (``run``, under leader election). One room per feature:
``nodejobs`` (the KubeEdge node jobs), ``diagnosis`` (Diagnoses and OperationSets), ``autonomy`` (edge
autonomy's approval and binding) and ``admission`` (the webhooks); at the top, what they share
(``keyed`` workers, ``watches``) and what the role runs beside them (``leader``, ``metrics``).
Importing one of its modules loads only what that module needs, not the whole role.
"""
