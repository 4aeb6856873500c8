"""What the hub writes on its edges' Node objects: the mark saying which hub holds each edge's
session (and which the Node watch shows already), and the Autonomy condition an edge reports.

It may import the hub's core modules (``api``, ``settings``, ``metrics``); no other room.
"""
