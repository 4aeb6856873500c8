"""The device's local Kubernetes API: the cloud objects its node needs, read from its cache, online or not.

:mod:`.local_api` serves it; :mod:`.paths` holds its paths and discovery documents as data,
:mod:`.peers` tells who owns a connecting socket. It may import the cache's view
(:mod:`roles.edge.cache`) and nothing else of the edge: the role starts it only when it is on.
"""
