"""The messages of a device that is a Kubernetes node: its tunnels to the API server, and its certificate.

Tunnels (:mod:`nodetask.tunnel`) carry the device's TLS connections to the API server through its hub;
the node's client certificate is issued through the cluster's CSR API at the device's request. Each
pair of messages flows only between peers that both list its capability. :mod:`nodetask.messages`
puts them in each direction's union.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from nodetask.message_base import Message

__all__ = [
    "MAX_TUNNEL",
    "NODE_CREDENTIALS_CAPABILITY",
    "TUNNEL_CAPABILITY",
    "NodeCredentials",
    "NodeCredentialsRequest",
    "TunnelClose",
    "TunnelCredit",
    "TunnelOpen",
    "TunnelOpened",
]

# ------------------------------------------------------------------------------------------- both ways

# Tunnels (:mod:`nodetask.tunnel`): a device's TLS connections to the API server, relayed by its hub.
# Both sides list TUNNEL_CAPABILITY (Hello, Welcome) before any of these flow.

TUNNEL_CAPABILITY: Final = "tunnel.v1"
"""The tunnel messages below and the data frames of :mod:`nodetask.tunnel`."""
MAX_TUNNEL: Final = 2**32 - 1
"""Highest tunnel number (a data frame carries it in four bytes)."""
TunnelNumber = Annotated[int, msgspec.Meta(ge=1, le=MAX_TUNNEL)]


class TunnelCredit(Message, frozen=True, tag="tunnel_credit"):
    """Both ways: the sender has read ``size`` more bytes of the tunnel; as many more may come."""

    stream: TunnelNumber
    size: Annotated[int, msgspec.Meta(ge=1, le=2**31)]


class TunnelClose(Message, frozen=True, tag="tunnel_close"):
    """Both ways: the tunnel is closed; with a ``reason`` it broke (and the reason says why)."""

    stream: TunnelNumber
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""


# --------------------------------------------------------------------------------------- cloud -> edge


class TunnelOpened(Message, frozen=True, tag="tunnel_opened"):
    """The hub connected the tunnel the edge opened to the API server: bytes may flow."""

    stream: TunnelNumber


# The node's client certificate, issued through the cluster's CSR API. Both sides list
# NODE_CREDENTIALS_CAPABILITY (Hello, Welcome) before either of these flows.

NODE_CREDENTIALS_CAPABILITY: Final = "node-credentials.v1"
""":class:`NodeCredentialsRequest` and its answer :class:`NodeCredentials`."""
MAX_REQUEST_ID: Final = 64
MAX_CSR_PEM: Final = 16 << 10
"""A PKCS#10 request in PEM: an EC P-256 one is about 500 bytes, an RSA 4096 one under 2 KiB."""
MAX_CERTIFICATE_PEM: Final = 64 << 10
"""The issued certificate in PEM, with any intermediates the signer adds."""
MAX_CA_BUNDLE_PEM: Final = 256 << 10
"""The CA bundle in PEM: a few hundred certificates."""
MAX_CREDENTIALS_ERROR: Final = 1024


class NodeCredentials(Message, frozen=True, tag="node_credentials"):
    """The answer to the :class:`NodeCredentialsRequest` ``id``: the signed certificate and the CA bundle the
    API server is verified with, or (``error`` not empty) why there is none. The edge checks both before it
    keeps them (the certificate's key must be its own, its subject the node's, and the CA its issuer)."""

    id: Annotated[str, msgspec.Meta(max_length=MAX_REQUEST_ID)]
    certificate: Annotated[str, msgspec.Meta(max_length=MAX_CERTIFICATE_PEM)] = ""
    ca_bundle: Annotated[str, msgspec.Meta(max_length=MAX_CA_BUNDLE_PEM)] = ""
    error: Annotated[str, msgspec.Meta(max_length=MAX_CREDENTIALS_ERROR)] = ""


# --------------------------------------------------------------------------------------- edge -> cloud


class TunnelOpen(Message, frozen=True, tag="tunnel_open"):
    """Open tunnel ``stream`` to the API server (the hub's; the edge names no address)."""

    stream: TunnelNumber


class NodeCredentialsRequest(Message, frozen=True, tag="node_credentials_request"):
    """Have the node's certificate signed: ``csr`` is a PKCS#10 request in PEM for CN ``system:node:<node>``,
    O ``system:nodes``, made with a key that never leaves the device. Answered with :class:`NodeCredentials`
    of the same ``id``; one at a time per node."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_REQUEST_ID)]
    csr: Annotated[str, msgspec.Meta(max_length=MAX_CSR_PEM)]
