"""A node's client certificate through the CSR API: what a request for one must say, and the controller's approval.

Pure: imports :mod:`schemas` and :mod:`nodetask` only, never :mod:`roles` (which parses the PKCS#10 requests
and certificates these rules are applied to).
"""
