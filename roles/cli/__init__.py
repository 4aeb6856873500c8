"""The command line: the ``nodetaskd`` binary that starts a role, and its commands.

``main`` starts a role from its configuration; ``commands`` holds the subcommands (``edge join`` and
``edge reset`` in ``join`` and ``reset``, ``token create`` in ``tokens``, ``certs create`` in ``certs``)
and ``ctl/`` the operator's view of jobs. One parser helper and one set of exit codes (``parsing``).
It may import any role's wiring and ``roles.common``; ``join`` and ``reset`` run on the device, on the
base install only.
"""
