"""Blocking calls to one OCI registry over the distribution HTTP API, with the bearer-token exchange.

Used by the upgrade artifact (:mod:`roles.edge.upgrade.artifact`), whose async entry points run these calls
in worker threads. A registry that answers 401 with a ``Bearer`` challenge (Docker Hub, GHCR, any
``docker-registry`` with token auth) gets the token exchange of :mod:`roles.edge.upgrade.registry_token`;
tokens are kept in a :class:`~roles.edge.upgrade.registry_token.Tokens` until they expire. Every request is
anonymous (an upgrade has no registry credentials): a registry that wants an account is refused
with a reason saying so. Redirects are followed, but ``Authorization`` goes to the same origin only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import urllib.error
import urllib.parse
import urllib.request
from email.message import Message
from http.client import HTTPMessage
from pathlib import Path
from typing import IO, Any, Final

from roles.common.registry_auth import ImageRef, api_host
from roles.edge.upgrade import registry_token

__all__ = ["RegistryClient", "RegistryError", "plain_http", "same_origin"]

HTTP_TIMEOUT_S: Final = 30.0
_PORTS: Final = {"http": 80, "https": 443}


class RegistryError(Exception):
    """The registry cannot be reached, refuses, or sends what was not asked for; the message says which."""


def plain_http(host: str, insecure: tuple[str, ...] = ()) -> bool:
    """Whether ``host`` is reached over plain HTTP: loopback registries and the configured insecure ones."""
    if host in insecure:
        return True
    name = host.rsplit(":", 1)[0].strip("[]") if not host.endswith("]") else host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def same_origin(first: str, second: str) -> bool:
    """Whether two URLs have the same scheme, host and port (default ports filled in)."""
    a, b = urllib.parse.urlsplit(first), urllib.parse.urlsplit(second)
    try:
        return (a.scheme.lower(), a.hostname, a.port or _PORTS.get(a.scheme.lower())) == (
            b.scheme.lower(),
            b.hostname,
            b.port or _PORTS.get(b.scheme.lower()),
        )
    except ValueError:  # a port out of range
        return False


class _SameOriginAuth(urllib.request.HTTPRedirectHandler):
    """Follows redirects, carrying ``Authorization`` only to the same origin.

    Registries redirect blob downloads to object storage or a CDN with a signed URL; the bearer
    token is the registry's alone and must not travel there.
    """

    def redirect_request(  # noqa: PLR0917 (the base class's signature)
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not same_origin(req.full_url, new.full_url):
            new.remove_header("Authorization")
        return new


class RegistryClient:
    """Blocking calls to one registry (run in worker threads), with a bearer token when it asks for one."""

    def __init__(self, ref: ImageRef, *, plain: bool, insecure: tuple[str, ...], tokens: registry_token.Tokens) -> None:
        self.ref = ref
        self.host = api_host(ref.registry)
        self.base = f"{'http' if plain else 'https'}://{self.host}/v2/{ref.repository}"
        self.scope = registry_token.pull_scope(ref.repository)
        self.insecure = insecure
        self.tokens = tokens
        self.realm = ""
        self._opener = urllib.request.build_opener(_SameOriginAuth)

    def _open(self, url: str, accept: str = "") -> Any:
        fresh = False
        while True:
            token = self.tokens.get(self.host, self.scope)
            headers = {"Accept": accept} if accept else {}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            try:
                return self._opener.open(urllib.request.Request(url, headers=headers), timeout=HTTP_TIMEOUT_S)
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code == 401 and not fresh:
                    # No token yet, or a kept one the registry no longer takes: one new token, one retry.
                    self.tokens.forget(self.host, self.scope)
                    self._fetch_token(exc.headers)
                    fresh = True
                    continue
                raise self._refusal(exc.code, str(exc.reason)) from None
            except (OSError, ValueError) as exc:
                reason = getattr(exc, "reason", exc)
                raise RegistryError(f"cannot reach registry {self.host}: {reason}") from None

    def _fetch_token(self, headers: Message) -> None:
        values = headers.get_all("WWW-Authenticate") or []
        try:
            challenge = registry_token.bearer_challenge(values)
        except ValueError as exc:
            raise RegistryError(f"registry {self.host} sent an unreadable WWW-Authenticate header: {exc}") from None
        if challenge is None:
            offered = ", ".join(v.split(" ", 1)[0] for v in values) or "no challenge"
            raise RegistryError(
                f"registry {self.host} requires credentials (401, {offered}):"
                " the upgrade artifact is pulled anonymously"
            )
        self.realm = challenge.params["realm"]
        asked_at = self.tokens.clock()
        try:
            url = registry_token.token_url(challenge, self.scope, plain_ok=lambda host: plain_http(host, self.insecure))
            token, expires_in = registry_token.fetch_token(url, timeout=HTTP_TIMEOUT_S)
        except registry_token.TokenError as exc:
            raise RegistryError(f"registry {self.host}: {exc}") from None
        self.tokens.put(self.host, self.scope, token, expires_in, asked_at=asked_at)

    def _refusal(self, code: int, reason: str) -> RegistryError:
        if code == 404:
            return RegistryError("not found in the registry")
        if code == 401:
            return RegistryError(
                f"registry {self.host} still answers 401 with the token from {self.realm} for {self.scope}:"
                " the repository is private or the token service grants no anonymous pull"
                " (the upgrade artifact is pulled anonymously)"
            )
        if code == 403:
            return RegistryError(f"registry {self.host} denies access to {self.ref.repository} (403)")
        return RegistryError(f"registry {self.host} answered {code} {reason}")

    def manifest(self, reference: str, *, accept: str, limit: int) -> tuple[bytes, str]:
        """The manifest ``reference`` (a tag or digest) names, at most ``limit`` bytes, and its Content-Type."""
        with self._open(f"{self.base}/manifests/{reference}", accept) as resp:
            body: bytes = resp.read(limit + 1)
            if len(body) > limit:
                raise RegistryError(f"the manifest of {self.ref} is larger than {limit} bytes")
            return body, str(resp.headers.get("Content-Type", ""))

    def blob(self, digest: str, size: int, target: Path) -> None:
        """Download the blob ``digest`` of ``size`` bytes into ``target``, checking both as it comes."""
        sha = hashlib.sha256()
        received = 0
        with self._open(f"{self.base}/blobs/{digest}") as resp, target.open("wb") as out:
            while chunk := resp.read(1 << 20):
                received += len(chunk)
                if received > size:
                    raise RegistryError(f"layer {digest} is larger than its manifest says ({size})")
                sha.update(chunk)
                out.write(chunk)
        got = f"sha256:{sha.hexdigest()}"
        if got != digest:
            raise RegistryError(f"layer digest mismatch: expected {digest}, downloaded {got}")
