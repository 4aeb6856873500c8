"""KubeDiag's diagnoses: a Diagnosis run as a pure state machine, its Tasks, and a Task as an edge job type.

The controller's side: :mod:`.run` with :mod:`.step` and :mod:`.stages`, and targets, paths, pipeline,
tasks, context, size. The hub's and edge's: :mod:`.dispatch` and :mod:`.job`. Pure: imports
:mod:`schemas`, :mod:`nodetask` and the node jobs' :mod:`flows.nodejobs.jobtype`, never :mod:`roles`.
"""
