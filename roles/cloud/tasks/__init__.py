"""KubeDiag's diagnosis Tasks on the hub: each sent to its node while the node is connected here, and
its status written from what the node reports.

It may import :mod:`roles.cloud.jobs` (the status writer and the error codes reports are answered
with: a Task runs as a job type of the node-task protocol) and the hub's core modules; no other room.
"""
