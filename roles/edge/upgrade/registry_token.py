"""The distribution bearer-token exchange, for the requests the upgrade artifact makes to its registry.

Docker Hub, GHCR, Quay and a ``docker-registry`` with ``auth: token`` answer an anonymous request
with 401 and a challenge such as::

    WWW-Authenticate: Bearer realm="https://auth.docker.io/token",service="registry.docker.io",
                      scope="repository:library/busybox:pull"

The client GETs the realm with ``service`` and ``scope`` as query parameters, reads ``token`` (or
``access_token``) from the JSON answer and repeats its request with ``Authorization: Bearer
<token>`` (the distribution "token authentication" specification). Tokens are kept per (registry,
scope) until their ``expires_in`` (:class:`Tokens`).

The exchange is anonymous: an upgrade has no registry credentials (a NodeUpgradeJob names no
``imageSecrets`` and the agent's configuration none), so a repository that only an account may
read is refused by the registry with the anonymous token, and the error says so.

The decisions are pure functions (:func:`parse_challenges`, :func:`bearer_challenge`,
:func:`token_url`, :func:`parse_token_answer`); :func:`fetch_token` is the one blocking call.
"""

from __future__ import annotations

import json
import math
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "Challenge",
    "TokenError",
    "Tokens",
    "bearer_challenge",
    "fetch_token",
    "parse_challenges",
    "parse_token_answer",
    "pull_scope",
    "token_url",
]

MAX_TOKEN_ANSWER_BYTES: Final = 64 << 10
"""Docker Hub's answers are about 2-5 KiB; a realm sending more is not a token service."""
DEFAULT_EXPIRES_S: Final = 60
"""The lifetime the specification gives a token whose answer names none."""
EARLY_S: Final = 5.0
"""A token is dropped this long before it expires, so that it does not expire in flight."""

# RFC 9110 §5.6.2 token, and a quoted-string with its backslash escapes.
_TOKEN = r"[!#$%&'*+.^_`|~0-9A-Za-z-]+"
_PARAM_RE = re.compile(rf'[ \t]*({_TOKEN})[ \t]*=[ \t]*(?:"((?:[^"\\]|\\.)*)"|({_TOKEN}))[ \t]*', re.DOTALL)
_SCHEME_RE = re.compile(rf"[ \t]*({_TOKEN})(?:[ \t]+|(?=,)|$)")
_TOKEN68_RE = re.compile(r"[ \t]*([A-Za-z0-9._~+/-]+=*)[ \t]*(?=,|$)")
_LIST_SEP_RE = re.compile(r"[ \t]*,[ \t]*")
_UNESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)
# What may go into an Authorization header: visible ASCII, so nothing can add a line to the request.
_BEARER_RE = re.compile(r"[\x21-\x7e]+")


class TokenError(Exception):
    """The token exchange failed; the message says at which step (without naming the registry)."""


@dataclass(frozen=True, slots=True)
class Challenge:
    """One challenge of a ``WWW-Authenticate`` header."""

    scheme: str
    """Lower-cased (``bearer``, ``basic``...)."""
    params: Mapping[str, str] = field(default_factory=dict)
    """Parameter names lower-cased, values unquoted."""
    token68: str = ""


def parse_challenges(value: str) -> tuple[Challenge, ...]:
    """The challenges of one ``WWW-Authenticate`` value (RFC 9110 §11.6.1), in order.

    Quoted values may hold commas, ``=`` and escaped quotes; scheme and parameter names are
    case-insensitive; several challenges may share the value (``Bearer realm="a", Basic realm="b"``).

    Errors: :class:`ValueError` naming the position where the value stops making sense.
    """
    challenges: list[Challenge] = []
    pos, end = 0, len(value)
    while pos < end:
        # Empty list elements are allowed (``, ,``).
        if sep := _LIST_SEP_RE.match(value, pos):
            pos = sep.end()
            continue
        if not value[pos:].strip(" \t"):
            break
        scheme = _SCHEME_RE.match(value, pos)
        if scheme is None:
            raise ValueError(f"no authentication scheme at offset {pos} of {value!r}")
        pos = scheme.end()
        params: dict[str, str] = {}
        token68 = ""
        if (t68 := _TOKEN68_RE.match(value, pos)) and not _PARAM_RE.match(value, pos):
            token68, pos = t68.group(1), t68.end()
        while (param := _PARAM_RE.match(value, pos)) is not None:
            name, quoted, bare = param.groups()
            params[name.lower()] = _UNESCAPE_RE.sub(r"\1", quoted) if quoted is not None else bare
            pos = param.end()
            sep = _LIST_SEP_RE.match(value, pos)
            if sep is None:
                break
            # After a comma comes another parameter of this challenge, or the next challenge's scheme.
            if _PARAM_RE.match(value, sep.end()) is None:
                break
            pos = sep.end()
        if pos < end and not _LIST_SEP_RE.match(value, pos) and value[pos:].strip(" \t"):
            raise ValueError(f"unexpected text at offset {pos} of {value!r}")
        challenges.append(Challenge(scheme=scheme.group(1).lower(), params=params, token68=token68))
    return tuple(challenges)


def bearer_challenge(values: Iterable[str]) -> Challenge | None:
    """The first Bearer challenge among a response's ``WWW-Authenticate`` values, or None.

    Errors: :class:`ValueError` for a value that does not parse, or a Bearer challenge without a realm.
    """
    for value in values:
        for challenge in parse_challenges(value):
            if challenge.scheme == "bearer":
                if not challenge.params.get("realm"):
                    raise ValueError(f"the Bearer challenge has no realm: {value!r}")
                return challenge
    return None


def pull_scope(repository: str) -> str:
    """The scope that lets a token read ``repository``."""
    return f"repository:{repository}:pull"


def token_url(challenge: Challenge, scope: str, *, plain_ok: Callable[[str], bool]) -> str:
    """The realm's URL with the challenge's ``service`` and our ``scope`` as query parameters.

    ``plain_ok(host)`` says whether ``host`` may be reached over plain HTTP; any other realm must
    be HTTPS, so a token is never asked for (nor sent back) in the clear by surprise.

    Errors: :class:`TokenError` for a realm that is no http(s) URL, or plain HTTP where not allowed.
    """
    realm = challenge.params["realm"]
    parts = urllib.parse.urlsplit(realm)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise TokenError(f"the token realm {realm!r} is not an http(s) URL")
    if parts.scheme == "http" and not plain_ok(parts.netloc):
        raise TokenError(
            f"the token realm {realm} is plain HTTP (list {parts.netloc} in insecureRegistries to allow it)"
        )
    query = {"service": challenge.params["service"]} if challenge.params.get("service") else {}
    query["scope"] = scope
    encoded = urllib.parse.urlencode(query)
    return urllib.parse.urlunsplit(
        parts._replace(query=f"{parts.query}&{encoded}" if parts.query else encoded, fragment="")
    )


def parse_token_answer(body: bytes) -> tuple[str, int]:
    """(token, expires_in seconds) from a token service's JSON answer.

    ``token`` wins over ``access_token`` (OAuth 2 name) when both are there, as in docker;
    ``expires_in`` defaults to 60 seconds.

    Errors: :class:`TokenError` for an answer that is not a JSON object with a usable token.
    """
    try:
        document: Any = json.loads(body)
    except (ValueError, RecursionError):
        raise TokenError("the token answer is not JSON") from None
    if not isinstance(document, dict):
        raise TokenError("the token answer is not a JSON object")
    token = document.get("token") or document.get("access_token")
    if not isinstance(token, str) or not token:
        raise TokenError("the token answer has no token")
    if not _BEARER_RE.fullmatch(token):
        raise TokenError("the token answer's token holds characters a header cannot carry")
    expires_in = document.get("expires_in")
    if isinstance(expires_in, bool) or not isinstance(expires_in, int | float) or not math.isfinite(expires_in):
        return token, DEFAULT_EXPIRES_S
    return token, int(expires_in) if expires_in >= 1 else DEFAULT_EXPIRES_S


@dataclass(slots=True)
class Tokens:
    """Bearer tokens by (registry, scope), each until shortly before its ``expires_in``.

    One belongs to one artifact (its resolve and its install), used by one thread at a time.
    """

    clock: Callable[[], float] = time.monotonic
    _held: dict[tuple[str, str], tuple[str, float]] = field(default_factory=dict)

    def get(self, registry: str, scope: str) -> str:
        """The token for ``scope`` at ``registry``, or "" if there is none still valid."""
        token, until = self._held.get((registry, scope), ("", 0.0))
        return token if until > self.clock() else ""

    def put(self, registry: str, scope: str, token: str, expires_in: float, *, asked_at: float) -> None:
        """Keep ``token`` until ``expires_in`` seconds after it was asked for (at ``asked_at``)."""
        self._held[(registry, scope)] = (token, asked_at + expires_in - EARLY_S)

    def forget(self, registry: str, scope: str) -> None:
        """Drop the token for ``scope`` (the registry refused it)."""
        self._held.pop((registry, scope), None)


def fetch_token(url: str, *, timeout: float) -> tuple[str, int]:
    """GET a token from ``url`` (from :func:`token_url`), anonymously; (token, expires_in).

    Blocking (run it in a worker thread). Errors: :class:`TokenError` saying what failed.
    """
    realm = url.split("?", 1)[0]
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            body: bytes = resp.read(MAX_TOKEN_ANSWER_BYTES + 1)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise TokenError(f"the token realm {realm} answered {exc.code} {exc.reason}") from None
    except (OSError, ValueError) as exc:
        raise TokenError(f"the token realm {realm} is unreachable: {getattr(exc, 'reason', exc)}") from None
    if len(body) > MAX_TOKEN_ANSWER_BYTES:
        raise TokenError(f"the token answer of {realm} is larger than {MAX_TOKEN_ANSWER_BYTES} bytes")
    return parse_token_answer(body)
