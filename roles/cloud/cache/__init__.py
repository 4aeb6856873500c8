"""Cache streams: each cache session's edge kept a copy of its node's Node, Pods, ConfigMaps and
Secrets, from one shared watch per kind, and its fetches answered within a rate.

It may import the hub's core modules (``api``, ``sessions``, ``settings``, ``metrics``); no other room.
"""
