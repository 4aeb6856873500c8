"""Edge autonomy (OpenYurt's): the controller's approval label and the Pods' tolerations a Node's duration sets.

Pure: imports :mod:`schemas` and :mod:`nodetask` only (the request annotations are
:mod:`nodetask.autonomy`'s), never :mod:`roles`.
"""
