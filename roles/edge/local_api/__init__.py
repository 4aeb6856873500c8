"""The device's local Kubernetes API: the cloud objects its node needs, read from its cache, online or not.

:mod:`.local_api` serves it; what a request asks is read by :mod:`.requests`, what goes back is built by
:mod:`.answers`, its paths and discovery documents are :mod:`.paths`' data, and :mod:`.peers` tells who
owns a connecting socket. It may import the cache (:mod:`roles.edge.cache`) and nothing else of the edge:
the role imports it only when the local API is on.
"""
