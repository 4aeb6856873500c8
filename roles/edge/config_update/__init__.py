"""A ConfigUpdateJob's device side: change fields of the agent's config file, restart, and keep or restore it.

:mod:`.config_update` runs the job's actions; :mod:`.fields` changes the fields of the YAML
document; :mod:`.pending` is the record of an update in flight, which the launcher and the
starting agent read to restore the previous file. The record and the fields import nothing of the
edge; :mod:`.config_update` may import the agent's task context and settings.
"""
