"""The edge role: the agent on each device (:mod:`roles.edge.agent`), wired up by :mod:`roles.edge.role`,
and the launcher that supervises it (:mod:`roles.edge.launcher`).

The agent's core is at the top: the role's wiring (``role``), the agent (``agent``), its session with a
hub (``session``, over ``ws_link``), the task runner that walks each node task (``task_runner``, within
``task_limits``), the outbox of reports (``outbox``), the local control socket (``control``), and the
device actions of each job type with what they are given (``actions``, ``context``, ``settings``).
The rooms below it:

* ``store``: the durable SQLite store, by table group;
* ``cache``: the cache of cloud objects kept through outages, its ledger and the autonomy manager;
* ``local_api``: the device's read-only Kubernetes API over the cache;
* ``upgrade``, ``config_update``, ``checks``: the device side of each node job;
* ``processors``: the diagnosis processors; ``runtime``: the container runtime (CRI) client;
* ``launcher``: the supervisor, which loads nothing of the agent.

Rooms import downwards only (the import contract "Inside the edge role" in pyproject.toml).
"""
