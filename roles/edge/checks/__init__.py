"""The node's readiness checks (CPU, memory, disk) that a job's ``check`` action runs.

:mod:`.checks` judges the readings against the thresholds; :mod:`.readings` holds what a reading is,
and :mod:`.host` takes them from the host (psutil, loaded by the first check). It imports nothing else
of the edge.
"""
