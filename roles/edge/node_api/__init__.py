"""The device's API endpoint for its node components: a stock kubelet's API server, online and offline.

A kubelet on the device names this endpoint as its API server (plain HTTP on loopback). Online, each
request goes to the cluster's API server through a tunnel in the hub session (:mod:`.tunnel_client`),
in TLS the hub cannot read, with the node's own client certificate (:mod:`.upstream`); the answers
come back as they are, and what they carry of the node's objects fills the device's cache
(:mod:`.cache_feed`). Offline, :mod:`.offline` answers from that cache as OpenYurt's YurtHub does, so
the kubelet keeps its pods. :mod:`.endpoint` serves it. The node's certificate is the device's own:
:mod:`.certificate_keeper` keeps it issued through the hub and the cluster's CSR API, with the key and the
checks of :mod:`.node_certificate`. It may import the session, the cache and
the local API (whose cache reads it reuses), and nothing else of the edge.
"""
