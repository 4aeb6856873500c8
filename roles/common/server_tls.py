"""What a server is given for TLS: one context, or a function giving the current one for each connection.

A function lets a server take up a rotated certificate (:mod:`roles.common.cert_reload`) without a
restart: it asks for the context as each connection is accepted, so new connections get the
new certificate while the open ones keep the one they started with. Only the standard library
here: :mod:`roles.common.httpserver`, which uses it, also runs on an edge device's base install.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

__all__ = ["ServerTls", "connection_context"]

ServerTls = ssl.SSLContext | Callable[[], ssl.SSLContext]


def connection_context(tls: ServerTls) -> ssl.SSLContext:
    """The context for a connection accepted now."""
    return tls() if callable(tls) else tls
