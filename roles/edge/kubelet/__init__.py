"""A NodeUpgradeJob with ``component: kubelet`` on the device: the node's kubelet swapped, restarted and proven.

:mod:`.upgrade` runs the job's actions; :mod:`.probe` is what they do to the kubelet (ask its version, restart
it under its supervisor, wait for it to be healthy). The artifact comes from a registry as the agent's own
does (:mod:`roles.edge.upgrade.artifact`), and the settings are the agent's ``kubelet`` block.
"""
