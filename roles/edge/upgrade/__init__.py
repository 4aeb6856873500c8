"""The agent's self-upgrade (a NodeUpgradeJob's device side): fetch an artifact, switch to it, prove it.

:mod:`.upgrade` runs the job's actions; :mod:`.artifact` fetches and checks the artifact from a
registry (:mod:`.registry_client`, :mod:`.registry_token`); :mod:`.marker` is the file and
link it shares with the launcher. The marker imports nothing of the edge, since the launcher loads it;
the rest may import the agent's task context (:mod:`roles.edge.context`) and the layers below it.
"""
