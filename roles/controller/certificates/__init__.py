"""Devices' node certificates, the controller's side: the approval of the requests the hubs create for them.

The rules are pure (``flows.certificates.node_requests``); this room watches CertificateSigningRequests and
writes what the rules say. It may import the flows, the API types, the kube client, ``roles.common`` and the
controller's shared machinery at the top (``keyed``, ``watches``); never another room of the controller.
"""
