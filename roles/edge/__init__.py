"""The edge role: the agent on each device (:mod:`roles.edge.agent`), wired up by :mod:`roles.edge.role`,
and the launcher that supervises it (:mod:`roles.edge.launcher`)."""
