"""Pure decisions, one room per system: node jobs, diagnoses, edge autonomy.

Flows decide, roles do I/O: every module here is plain functions over immutable API objects and may
import only :mod:`schemas` and :mod:`nodetask` (and anyio-free libraries), never :mod:`roles`.
"""
