"""KubeDiag's diagnoses: a Diagnosis run as a pure state machine, its Tasks, and a Task as an edge job type.

The controller's side (:mod:`.run`, targets, paths, pipeline, tasks, context, size) and the hub's and
edge's (:mod:`.dispatch`, :mod:`.job`). Pure: imports :mod:`schemas`, :mod:`nodetask` and the node jobs'
:mod:`flows.nodejobs.jobtype`, never :mod:`roles`.
"""
