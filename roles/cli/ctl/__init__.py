"""``nodetaskd ctl``: the operator's view of node jobs and edges, through the same Kube client the roles use.

``get`` (jobs of the three kinds with phase and node counts), ``watch`` (live until final; exit 0 on
Completed, 1 on Failure), ``describe`` (a row per node: phase, last action, reason, hub, agent
version; the latest Events), ``confirm`` (the cloud's confirmation annotation), ``retry`` (a new
retry annotation value, the stale confirm annotation taken away) and ``nodes`` (each edge's hub,
agent version, whether a hub holds its session). Tables by default, ``-o json|yaml``.

The subcommands' arguments and output (``commands``), pure views (``views``, ``follow``, ``text``),
the API reads and writes (``fetch``, ``watch``), and the terminal view (``live``, the only user of
rich: the ``ctl`` extra).
"""
