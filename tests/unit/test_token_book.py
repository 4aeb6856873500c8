"""The hub's token book: what the watch says ends cached tokens, and a failing watch is not trusted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import anyio
import anyio.abc
import pytest
import structlog
import trio.testing

from roles.cloud.auth import AuthError, TokenBook, token_secret
from roles.kube import Deleted, Interrupted, Kube, NotFound, Relisted, WatchEvent
from schemas.core import Secret

NAMESPACE = "kube-system"


class FakeSecrets:
    """Secrets by name for GETs, and the token watch's stream for the test to feed."""

    def __init__(self) -> None:
        self.secrets: dict[str, Secret] = {}
        self.reads = 0
        self.gate: anyio.Event | None = None
        """When set, a GET's answer waits for it: a read in flight while the watch moves on."""
        self.events: anyio.abc.ObjectSendStream[WatchEvent] | None = None

    def put(self, node: str, token: str) -> Secret:
        secret = token_secret(node, token, namespace=NAMESPACE)
        self.secrets[secret.metadata.name] = secret
        return secret

    async def get(self, _resource: Any, name: str, *, namespace: str = "") -> Secret:
        self.reads += 1
        answer = self.secrets.get(name)  # what the API server said, even if it reaches the hub late
        if self.gate is not None:
            await self.gate.wait()
        if answer is None:
            raise NotFound(404, "NotFound", f"secrets {name!r} not found")
        return answer

    async def watch(self, _resource: Any, send: anyio.abc.ObjectSendStream[WatchEvent], **_: Any) -> None:
        self.events = send
        await anyio.sleep_forever()

    async def say(self, event: WatchEvent) -> None:
        """Deliver a watch event and let the book take it in."""
        assert self.events is not None
        await self.events.send(event)
        await trio.testing.wait_all_tasks_blocked()


@pytest.fixture
async def book() -> AsyncIterator[tuple[TokenBook, FakeSecrets]]:
    """A token book whose watch runs against fake Secrets."""
    fake = FakeSecrets()
    tokens = TokenBook(cast("Kube", fake), namespace=NAMESPACE, log=structlog.get_logger())
    async with anyio.create_task_group() as tg:
        await tg.start(tokens.watch)
        await trio.testing.wait_all_tasks_blocked()
        yield tokens, fake
        tg.cancel_scope.cancel()


async def test_a_failing_watch_is_not_trusted_until_it_lists_again(book: tuple[TokenBook, FakeSecrets]) -> None:
    """After an interruption, a token the watch knew is checked against the API until the next list."""
    tokens, fake = book
    await fake.say(Relisted((fake.put("n1", "old"),)))
    await tokens.check("n1", "old")
    assert fake.reads == 0
    fake.put("n1", "new")  # rotated while the watch cannot say so
    await fake.say(Interrupted("connection reset"))
    with pytest.raises(AuthError, match="not node n1's"):
        await tokens.check("n1", "old")
    assert not tokens.watching("n1")
    await fake.say(Relisted((fake.secrets["nodetaskd-edge-n1"],)))
    await tokens.check("n1", "new")
    assert fake.reads == 1


async def test_a_read_answered_across_a_watch_event_is_used_but_not_cached(
    book: tuple[TokenBook, FakeSecrets],
) -> None:
    """A GET still in flight when the Secret is deleted lets that handshake in, and nothing after it."""
    tokens, fake = book
    await fake.say(Relisted(()))
    secret = fake.put("n1", "old")  # not known to the watch (say, unlabelled until now)
    fake.gate = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(tokens.check, "n1", "old")
        await trio.testing.wait_all_tasks_blocked()
        del fake.secrets[secret.metadata.name]
        await fake.say(Deleted(secret))
        fake.gate.set()
    with pytest.raises(AuthError, match="has no token Secret"):
        await tokens.check("n1", "old")
    assert fake.reads == 2


async def test_a_relist_ends_tokens_cached_for_secrets_that_are_gone(book: tuple[TokenBook, FakeSecrets]) -> None:
    """A Secret deleted while the watch was away is missing from the next list: its cached token ends."""
    tokens, fake = book
    await fake.say(Relisted(()))
    secret = fake.put("n1", "old")
    await tokens.check("n1", "old")  # read and cached
    await tokens.check("n1", "old")
    assert fake.reads == 1
    del fake.secrets[secret.metadata.name]
    await fake.say(Relisted(()))
    with pytest.raises(AuthError, match="has no token Secret"):
        await tokens.check("n1", "old")
