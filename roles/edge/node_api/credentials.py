"""The node's credentials for the API server: its client certificate and key, and the cluster's CA.

Files in ``nodeApi.credentialsDir`` (``<dataDir>/node-credentials`` by default): ``node.crt`` (the
certificate of ``system:node:<node>``, group ``system:nodes``), ``node.key`` and ``ca.crt``.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final

from roles.common.config import ConfigError
from roles.edge.node_api.upstream import NodeTls

__all__ = ["CA_FILE", "CERT_FILE", "KEY_FILE", "load_node_tls"]

CERT_FILE: Final = "node.crt"
KEY_FILE: Final = "node.key"
CA_FILE: Final = "ca.crt"


def load_node_tls(directory: Path, server_name: str) -> NodeTls:
    """The TLS the device speaks to the API server with. Errors: :class:`ConfigError` naming the file."""
    ca, cert, key = directory / CA_FILE, directory / CERT_FILE, directory / KEY_FILE
    for path in (ca, cert, key):
        if not path.is_file():
            raise ConfigError(f"nodeApi.credentialsDir: {path} is missing (the node's credentials come from join)")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"nodeApi.credentialsDir: {ca} is not a CA certificate: {exc}") from None
    try:
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(
            f"nodeApi.credentialsDir: {cert} and {key} are not a certificate and its key: {exc}"
        ) from None
    # HTTP/1.1 only: the API server would otherwise be free to pick HTTP/2, which the relay does not speak.
    context.set_alpn_protocols(["http/1.1"])
    return NodeTls(context=context, server_name=server_name)
