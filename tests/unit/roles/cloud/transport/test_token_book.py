"""The hub's token book: what the watch says ends cached tokens, and a failing watch is not trusted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

import anyio
import anyio.abc
import pytest
import structlog
import trio.testing

from roles.cloud.transport.auth import READ_ANSWERS_KEPT, AuthError, TokenBook
from roles.kube import Deleted, Interrupted, Kube, Relisted, Upserted
from tests.unit.roles.cloud.transport.doubles import NAMESPACE, FakeSecrets


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


async def test_two_thousand_wrong_tokens_for_one_node_cost_one_secret_read(
    book: tuple[TokenBook, FakeSecrets], autojump_clock: trio.testing.MockClock
) -> None:
    """Checks arriving during a read share it, and what it found answers every check for a few seconds."""
    tokens, fake = book
    fake.put("n1", "right")
    fake.gate = anyio.Event()
    refused: list[int] = []

    async def attempt(i: int) -> None:
        try:
            await tokens.check("n1", f"wrong-{i}")
        except AuthError as exc:
            refused.append(exc.status)

    async with anyio.create_task_group() as tg:
        for i in range(1000):
            tg.start_soon(attempt, i)
        await trio.testing.wait_all_tasks_blocked()
        fake.gate.set()
    for i in range(1000, 2000):
        await attempt(i)
    assert refused == [403] * 2000
    assert fake.reads == 1
    await tokens.check("n1", "right")  # the same answer lets the right token in
    assert fake.reads == 1
    await anyio.sleep(5.0)
    await attempt(2000)
    assert fake.reads == 2


async def test_a_node_without_a_token_secret_is_remembered_until_the_watch_says_otherwise(
    book: tuple[TokenBook, FakeSecrets],
) -> None:
    """A missing Secret is read once; its creation, seen by the watch, lets the edge in at once."""
    tokens, fake = book
    await fake.say(Relisted(()))
    for _ in range(50):
        with pytest.raises(AuthError, match="has no token Secret"):
            await tokens.check("late", "t")
    assert fake.reads == 1
    await fake.say(Upserted(fake.put("late", "t")))
    await tokens.check("late", "t")


async def test_a_rotated_unwatched_token_is_let_in_once_the_last_read_is_a_few_seconds_old(
    book: tuple[TokenBook, FakeSecrets], autojump_clock: trio.testing.MockClock
) -> None:
    """Without a watch event, a rotation waits at most ``reread_after`` for the next read."""
    tokens, fake = book
    fake.put("n1", "old")
    with pytest.raises(AuthError):
        await tokens.check("n1", "stale")
    fake.put("n1", "new")
    with pytest.raises(AuthError, match="not node n1's"):
        await tokens.check("n1", "new")
    await anyio.sleep(5.0)
    await tokens.check("n1", "new")
    assert fake.reads == 2


async def test_an_api_server_that_does_not_answer_is_asked_again(book: tuple[TokenBook, FakeSecrets]) -> None:
    """A failed read teaches nothing about the Secret: it is not remembered, and the next check reads."""
    tokens, fake = book
    fake.put("n1", "right")
    fake.unavailable = True
    with pytest.raises(AuthError) as refused:
        await tokens.check("n1", "right")
    assert refused.value.status == 503
    fake.unavailable = False
    await tokens.check("n1", "right")
    assert fake.reads == 2


async def test_remembered_reads_are_bounded_whatever_names_are_tried(book: tuple[TokenBook, FakeSecrets]) -> None:
    """Node names are the sender's choice: past the bound, the oldest answers are forgotten (and read again)."""
    tokens, fake = book
    names = [f"ghost-{i}" for i in range(READ_ANSWERS_KEPT + 100)]
    for name in names:
        with pytest.raises(AuthError):
            await tokens.check(name, "t")
    assert fake.reads == len(names)
    with pytest.raises(AuthError):
        await tokens.check(names[-1], "t")  # still remembered
    assert fake.reads == len(names)
    with pytest.raises(AuthError):
        await tokens.check(names[0], "t")  # forgotten: read again
    assert fake.reads == len(names) + 1


@pytest.mark.parametrize("node", ["x/../../../../../../healthz", "edge-1#x", "Edge", "a" * 254, ".."])
async def test_a_name_that_is_no_node_name_is_refused_without_a_read(
    book: tuple[TokenBook, FakeSecrets], node: str
) -> None:
    """The node name becomes part of a Secret's name only once it is a valid node name."""
    tokens, fake = book
    with pytest.raises(AuthError) as refused:
        await tokens.check(node, "t")
    assert refused.value.status == 400
    assert fake.reads == 0
