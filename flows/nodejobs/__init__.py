"""The node jobs (``operations.kubeedge.io``): one module per job type, and what the controller and hubs decide.

A job type's module holds its action flow, spec type and how a report changes a node's status
(:mod:`.jobtype` is what they share); :mod:`.decide` and :mod:`.retry` are the controller's decisions,
:mod:`.changes` the hubs' status changes. Pure: imports :mod:`schemas` and :mod:`nodetask` only.
"""
