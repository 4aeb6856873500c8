"""A real distribution token service on 127.0.0.1, for a ``docker-registry`` with ``auth: token``.

What Docker Hub's ``auth.docker.io`` does, small: ``GET /token?service=...&scope=...`` answers
``{"token": <JWT>, "expires_in": ...}``, the JWT signed (RS256) by a self-signed certificate that
the registry trusts (its ``rootcertbundle``) and carries in its ``x5c`` header, and granting what
:attr:`TokenServer.grants` allows anonymously. Tests get push tokens straight from
:meth:`TokenServer.issue`. The server runs in a thread owned by the ``with`` block that starts it.
"""

from __future__ import annotations

import base64
import datetime
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.x509.oid import NameOID

from tools.provision.containerd import TokenAuth

SERVICE: Final = "nodetaskd-test-registry"
ISSUER: Final = "nodetaskd-test-token-issuer"
LIFETIME_S: Final = 300


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class TokenRequest:
    """One request the token service answered (for assertions)."""

    service: str
    scopes: tuple[str, ...]
    authorization: bool
    """Whether the client sent credentials (an anonymous exchange sends none)."""


@dataclass
class TokenServer:
    """The token service; its state is read and changed by the test while its thread serves."""

    key: rsa.RSAPrivateKey
    certificate: x509.Certificate
    cert_file: Path
    realm: str = ""
    grants: dict[str, frozenset[str]] = field(default_factory=dict)
    """Repository to the actions an anonymous token may hold (none for a repository not listed)."""
    answer: bytes | None = None
    """When set, the raw body of every answer instead of a token (a broken token service)."""
    requests: list[TokenRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def auth(self) -> TokenAuth:
        """The registry's ``auth: token`` settings for this service."""
        return TokenAuth(realm=self.realm, service=SERVICE, issuer=ISSUER, rootcertbundle=self.cert_file)

    def issue(self, repository: str, actions: tuple[str, ...], *, subject: str = "") -> str:
        """A signed token granting ``actions`` on ``repository`` (empty actions: a token that grants nothing)."""
        now = int(time.time())
        header = {
            "typ": "JWT",
            "alg": "RS256",
            "x5c": [base64.b64encode(self.certificate.public_bytes(serialization.Encoding.DER)).decode()],
        }
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + LIFETIME_S,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": [{"type": "repository", "name": repository, "actions": list(actions)}] if actions else [],
        }
        signing_input = ".".join(_b64url(json.dumps(part).encode()) for part in (header, claims))
        signature = self.key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64url(signature)}"

    def _answer(self, query: dict[str, list[str]], authorization: bool) -> bytes:
        scopes = tuple(query.get("scope", ()))
        service = query.get("service", [""])[0]
        with self._lock:
            self.requests.append(TokenRequest(service=service, scopes=scopes, authorization=authorization))
            if self.answer is not None:
                return self.answer
            granted = dict(self.grants)
        # One scope is what clients ask for a pull: repository:<name>:<actions>.
        repository = ""
        wanted: tuple[str, ...] = ()
        if scopes:
            kind, _, rest = scopes[0].partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository":
                repository, wanted = name, tuple(a for a in actions.split(",") if a)
        allowed = tuple(a for a in wanted if a in granted.get(repository, frozenset()))
        token = self.issue(repository, allowed, subject="anonymous")
        return json.dumps({"token": token, "access_token": token, "expires_in": LIFETIME_S}).encode()


def _certificate(key: rsa.RSAPrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )


@contextmanager
def token_server(directory: Path) -> Iterator[TokenServer]:
    """A token service on 127.0.0.1 with its certificate in ``directory``; stopped when the block ends."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    certificate = _certificate(key)
    cert_file = directory / "token-signer.pem"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    server = TokenServer(key=key, certificate=certificate, cert_file=cert_file)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path != "/token":
                self.send_error(404)
                return
            body = server._answer(urllib.parse.parse_qs(url.query), "Authorization" in self.headers)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # the test asserts on server.requests instead

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.realm = f"http://127.0.0.1:{httpd.server_address[1]}/token"
    thread = threading.Thread(target=httpd.serve_forever, name="token-server", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()
