"""The node's credentials for the API server: its client certificate and key, and the cluster's CA.

Files in ``nodeApi.credentialsDir`` (``<dataDir>/node-credentials`` by default): ``node.crt`` (the
certificate of ``system:node:<node>``, group ``system:nodes``), ``node.key`` and ``ca.crt``. They are
read when a connection to the API server is made and the files changed since the last read (a
certificate issued or renewed while the agent runs reaches the next connection; open ones keep theirs);
until all three are there, or while they cannot be used, the endpoint answers from the cache and the
log says why, once per change. The agent keeps them issued itself, through its hubs and the cluster's CSR
API (:mod:`roles.edge.node_api.certificate_keeper`); files put there by hand are used as long as they are
the node's and not due.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Final, final

import structlog

from roles.edge.node_api.upstream import NodeTls

__all__ = ["CA_FILE", "CERT_FILE", "KEY_FILE", "CredentialFiles", "CredentialsError", "load_node_tls"]

Log = structlog.typing.FilteringBoundLogger

CERT_FILE: Final = "node.crt"
KEY_FILE: Final = "node.key"
CA_FILE: Final = "ca.crt"


class CredentialsError(Exception):
    """The node's credential files cannot be used; the message names the file and why."""


def load_node_tls(directory: Path, server_name: str) -> NodeTls:
    """The TLS the device speaks to the API server with. Errors: :class:`CredentialsError` naming the file."""
    ca, cert, key = directory / CA_FILE, directory / CERT_FILE, directory / KEY_FILE
    for path in (ca, cert, key):
        if not path.is_file():
            raise CredentialsError(f"{path} is missing (the agent asks its hub for the node's certificate)")
    try:
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    except (ssl.SSLError, OSError) as exc:
        raise CredentialsError(f"{ca} is not a CA certificate: {exc}") from None
    try:
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        raise CredentialsError(f"{cert} and {key} are not a certificate and its key: {exc}") from None
    # HTTP/1.1 only: the API server would otherwise be free to pick HTTP/2, which the endpoint does not speak.
    context.set_alpn_protocols(["http/1.1"])
    return NodeTls(context=context, server_name=server_name)


@final
class CredentialFiles:
    """The node's TLS from the files in ``directory``, read again whenever they change (a ``NodeTlsSource``)."""

    def __init__(self, directory: Path, server_name: str, *, log: Log) -> None:
        self._directory = directory
        self._server_name = server_name
        self._log = log
        self._seen: tuple[tuple[int, int], ...] | None = None
        self._tls: NodeTls | None = None

    def _stamp(self) -> tuple[tuple[int, int], ...]:
        stamps = []
        for name in (CA_FILE, CERT_FILE, KEY_FILE):
            try:
                stat = (self._directory / name).stat()
            except OSError:
                stamps.append((0, 0))
            else:
                stamps.append((stat.st_mtime_ns, stat.st_size))
        return tuple(stamps)

    def __call__(self) -> NodeTls | None:
        stamp = self._stamp()
        if stamp != self._seen:
            self._seen = stamp
            try:
                self._tls = load_node_tls(self._directory, self._server_name)
            except CredentialsError as exc:
                self._tls = None
                self._log.warning("node_credentials_unusable", error=str(exc), setting="nodeApi.credentialsDir")
            else:
                self._log.info("node_credentials_loaded", directory=str(self._directory))
        return self._tls
