"""The HTTP server's messages and routing: a request, a response (whole or streamed), routes and the router.

What a handler sees and gives back, apart from the server that carries them
(:mod:`roles.common.httpserver`), so the routes of the webhooks, health and local API are built
without it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus

__all__ = ["Handler", "HttpRoute", "Request", "Response", "Send", "router"]


@dataclass(frozen=True, slots=True)
class Request:
    """One complete request; header names are lower-case, in the order received."""

    method: str
    path: str
    query: str
    headers: tuple[tuple[str, str], ...]
    body: bytes

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (any case), or None."""
        name = name.lower()
        return next((v for k, v in self.headers if k == name), None)


Send = Callable[[bytes], Awaitable[None]]
"""Sends one piece of a streamed body; raises if the peer is gone or takes longer than the idle timeout."""


@dataclass(frozen=True, slots=True)
class Response:
    """A response; ``content-length`` and ``content-type`` are added when sent.

    With ``stream``, the body is not ``body`` but what ``stream(send)`` sends, piece by piece (chunked),
    until it returns: a watch. ``stream`` is cancelled if the peer closes its end, and the connection
    always ends with such a response, so a long stream never holds up a request queued behind it.
    """

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()
    stream: Callable[[Send], Awaitable[None]] | None = None

    @classmethod
    def text(cls, status: int, text: str, *, headers: tuple[tuple[str, str], ...] = ()) -> Response:
        """A plain-text response; a final newline is added for people using curl."""
        return cls(status=status, body=f"{text}\n".encode(), headers=headers)

    @classmethod
    def json(cls, status: int, body: bytes) -> Response:
        """A response with an already-encoded JSON body."""
        return cls(status=status, body=body, content_type="application/json")

    @classmethod
    def streamed(cls, status: int, stream: Callable[[Send], Awaitable[None]], *, content_type: str) -> Response:
        """A response whose body ``stream`` sends as it is produced."""
        return cls(status=status, content_type=content_type, stream=stream)


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class HttpRoute:
    """``handler`` answers ``method`` on ``path``, or on every path under it with ``prefix``."""

    method: str
    path: str
    handler: Handler
    prefix: bool = False

    def matches(self, path: str) -> bool:
        return path == self.path or (self.prefix and path.startswith(self.path))


def router(routes: Iterable[HttpRoute]) -> Handler:
    """A handler that dispatches to ``routes``: 404 for an unknown path, 405 (with Allow) for a known
    path asked with another method. An exact path wins over a prefix, a longer prefix over a shorter.
    """
    table = sorted(routes, key=lambda r: (r.prefix, -len(r.path)))

    async def route(request: Request) -> Response:
        matching = [r for r in table if r.matches(request.path)]
        if not matching:
            return Response.text(HTTPStatus.NOT_FOUND, f"no such path: {request.path}")
        # Only routes as specific as the best match count: a prefix route's other methods must not
        # shadow a 405 on a more specific path.
        best = [r for r in matching if (r.prefix, r.path) == (matching[0].prefix, matching[0].path)]
        for r in best:
            if r.method == request.method:
                return await r.handler(request)
        allowed = ", ".join(sorted({r.method for r in best}))
        return Response.text(
            HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not allowed here", headers=(("allow", allowed),)
        )

    return route
