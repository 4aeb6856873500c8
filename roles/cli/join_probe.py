"""``edge join``'s look at the hubs before anything is written: the CA, the token and the URLs are right.

For each hub URL, join opens the websocket the agent would (``<url>/nodes/<node>``, the node's bearer
token, TLS checked against the CA given, else the system's) and closes it before saying hello, so no
session starts and a running agent's session is left alone. A hub that refuses the token, a
certificate the CA does not verify, or a URL that is not a hub's is a mistake in what was given:
join stops naming it. A hub that cannot be reached now (down, or a network the device is not on
yet) is only noted, unless none of them can be: then join stops too, and ``--no-hub-check`` installs
without asking them (a device imaged away from its network).
"""

from __future__ import annotations

import enum
import functools
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import trio
import trio_websocket

from nodetask.link import NORMAL_CLOSE, LinkClosed
from roles.cli.join_layout import JoinError
from roles.edge.ws_link import open_ws_link

__all__ = ["PROBE_TIMEOUT_S", "HubAnswer", "Outcome", "probe_hubs", "verdict"]

PROBE_TIMEOUT_S: Final = 10.0
"""How long join waits for one hub's TCP, TLS and websocket handshakes."""
_BODY_SHOWN: Final = 200


class Outcome(enum.Enum):
    ACCEPTED = "accepted"
    REFUSED = "refused"
    """The hub, or what answers at its URL, says what was given is wrong: a mistake to fix before joining."""
    BUSY = "busy"
    """A hub at its limits (503): it is there and the rest cannot be told; not the join's fault."""
    UNREACHABLE = "unreachable"


@dataclass(frozen=True, slots=True)
class HubAnswer:
    url: str
    outcome: Outcome
    detail: str = ""


def _causes(error: BaseException) -> list[BaseException]:
    """``error``, the exceptions inside it (groups) and their causes, depth first."""
    seen: list[BaseException] = []
    stack = [error]
    while stack:
        current = stack.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, BaseExceptionGroup):
            stack.extend(reversed(current.exceptions))
        stack.extend(linked for linked in (current.__cause__, current.__context__) if linked is not None)
    return seen


def _rejected(url: str, cause: trio_websocket.ConnectionRejected, *, node: str) -> HubAnswer:
    said = (cause.body or b"").decode("utf-8", "replace").strip()[:_BODY_SHOWN]
    status = cause.status_code
    if status == 503:
        return HubAnswer(url, Outcome.BUSY, f"503 {said}".strip())
    if status in (401, 403):
        return HubAnswer(url, Outcome.REFUSED, f"refused the token for node {node} ({status}: {said})")
    return HubAnswer(url, Outcome.REFUSED, f"answered {status} ({said or 'no reason given'}): is it a hub's URL?")


def _tls_failed(url: str, cause: ssl.SSLError) -> HubAnswer:
    if isinstance(cause, ssl.SSLCertVerificationError):
        reason = cause.verify_message or str(cause)
        return HubAnswer(url, Outcome.REFUSED, f"its certificate does not verify against the CA ({reason})")
    return HubAnswer(url, Outcome.REFUSED, f"TLS failed ({cause.reason or cause}): is it a hub's wss:// URL?")


def _judge(url: str, error: BaseException, *, node: str) -> HubAnswer:
    """What a failed handshake says: the hub's refusal first, then TLS's, then the network's."""
    causes = _causes(error)
    rejected = next((c for c in causes if isinstance(c, trio_websocket.ConnectionRejected)), None)
    if rejected is not None:
        return _rejected(url, rejected, node=node)
    tls = next((c for c in causes if isinstance(c, ssl.SSLError)), None)
    if tls is not None:
        return _tls_failed(url, tls)
    networks = [c for c in causes if isinstance(c, OSError)]
    if networks:
        # trio's "all attempts to connect failed" carries the reason (refused, no route) in its causes.
        said = [e.strerror for e in networks if e.strerror] or [str(networks[0]) or type(networks[0]).__name__]
        return HubAnswer(url, Outcome.UNREACHABLE, said[0])
    return HubAnswer(url, Outcome.UNREACHABLE, str(error) or type(error).__name__)


async def _probe(url: str, *, node: str, token: str, context: ssl.SSLContext | None, limit_s: float) -> HubAnswer:
    endpoint = f"{url.rstrip('/')}/nodes/{node}"
    headers = [(b"authorization", f"Bearer {token}".encode())]
    tls = context if url.startswith("wss://") else None
    with trio.move_on_after(limit_s):
        try:
            # The agent's own connection (TLS checked before the websocket handshake), closed before a hello: the
            # hub starts no session for it.
            async with open_ws_link(endpoint, headers=headers, ssl_context=tls) as link:
                await link.close(NORMAL_CLOSE, "edge join checked the token")
        except LinkClosed as exc:
            return _judge(url, exc, node=node)
        return HubAnswer(url, Outcome.ACCEPTED)
    return HubAnswer(url, Outcome.UNREACHABLE, f"no answer within {limit_s:g} s")


def probe_hubs(
    hubs: Sequence[str], *, node: str, token: str, ca: str | None, timeout: float = PROBE_TIMEOUT_S
) -> list[HubAnswer]:
    """What each hub answers ``node``'s ``token`` over TLS checked against ``ca`` (PEM; None: the system's roots),
    asked at once."""
    context = ssl.create_default_context(cadata=ca) if ca is not None else ssl.create_default_context()
    answers: list[HubAnswer | None] = [None] * len(hubs)

    async def ask(index: int, url: str) -> None:
        answers[index] = await _probe(url, node=node, token=token, context=context, limit_s=timeout)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            for index, url in enumerate(hubs):
                nursery.start_soon(functools.partial(ask, index, url))

    trio.run(main)
    return [a for a in answers if a is not None]


def verdict(answers: Sequence[HubAnswer]) -> list[str]:
    """A line per hub for join to print; :class:`JoinError` naming every mistake, or when no hub could be asked."""
    refused = [a for a in answers if a.outcome is Outcome.REFUSED]
    if refused:
        raise JoinError("; ".join(f"hub {a.url} {a.detail}" for a in refused) + "; nothing was written")
    if answers and all(a.outcome is Outcome.UNREACHABLE for a in answers):
        said = "; ".join(f"{a.url}: {a.detail}" for a in answers)
        raise JoinError(
            f"no hub could be reached to check the token ({said}); nothing was written."
            " --no-hub-check installs without asking them"
        )
    lines = []
    for a in answers:
        if a.outcome is Outcome.ACCEPTED:
            lines.append(f"hub {a.url}: certificate verified, token accepted for this node")
        elif a.outcome is Outcome.BUSY:
            lines.append(f"hub {a.url}: at its limits now ({a.detail}); the agent retries it")
        else:
            lines.append(f"hub {a.url}: not reachable now ({a.detail}); the agent retries it")
    return lines
