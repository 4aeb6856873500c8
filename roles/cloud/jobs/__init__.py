"""Node jobs on the hub: the job watch, a runner per running job claiming its nodes, reports written
into job status through one coalescing status writer per job, and the registry credentials of a
job's images.

It may import the hub's core modules (``api``, ``changes``, ``sessions``, ``settings``, ``metrics``);
no other room.
"""
