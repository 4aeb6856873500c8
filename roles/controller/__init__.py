"""The controller role: watches the jobs and diagnoses, picks their nodes, computes their phases, validates them.

:mod:`roles.controller.role` wires it (``run``, under leader election). Importing one of its modules loads
only what that module needs, not the whole role.
"""
