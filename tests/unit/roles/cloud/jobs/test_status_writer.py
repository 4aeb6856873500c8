"""The per-job status writer: coalescing, re-application after a conflict, errors, abandoned changes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import anyio
import pytest
import structlog
import trio.testing

from roles.cloud.jobs.status_writer import StatusWriter
from roles.kube import ApiError, Kube
from roles.kube.resources import NODES
from tests.unit.roles.cloud.jobs.doubles import FakeStatusApi


def _add(n: int) -> Callable[[int], tuple[int | None, int]]:
    def change(value: int) -> tuple[int | None, int]:
        return value + n, value + n

    return change


def _writer(api: FakeStatusApi, window: float) -> StatusWriter:
    return StatusWriter(cast("Kube", api), NODES, "job", window=window, log=structlog.get_logger())


def _nothing(value: int) -> tuple[int | None, str]:
    return None, "unchanged"


async def _submit_all(writer: StatusWriter, changes: list[Any]) -> list[Any]:
    outcomes: list[Any] = [None] * len(changes)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)

        async def one(i: int) -> None:
            outcomes[i] = await writer.submit(changes[i])

        async with anyio.create_task_group() as submitters:
            for i in range(len(changes)):
                submitters.start_soon(one, i)
        writer.close()
    return outcomes


async def test_changes_submitted_within_the_window_make_one_write(autojump_clock: trio.testing.MockClock) -> None:
    """Ten changes arriving together are applied in order by a single write."""
    api = FakeStatusApi()
    outcomes = await _submit_all(_writer(api, 0.2), [_add(1)] * 10)
    assert api.writes == 1
    assert api.value == 10
    assert sorted(outcomes) == list(range(1, 11))


async def test_window_zero_writes_once_per_change(autojump_clock: trio.testing.MockClock) -> None:
    """With coalescing off, every change is its own write."""
    api = FakeStatusApi()
    await _submit_all(_writer(api, 0.0), [_add(1)] * 5)
    assert api.writes == 5


async def test_outcomes_come_from_the_attempt_that_was_written(autojump_clock: trio.testing.MockClock) -> None:
    """After a conflict the batch is re-applied to the fresh object and submitters see that result."""
    api = FakeStatusApi(conflicts=2)
    outcomes = await _submit_all(_writer(api, 0.1), [_add(1)])
    assert outcomes == [201]
    assert api.value == 201


async def test_a_failed_write_raises_in_every_submitter(autojump_clock: trio.testing.MockClock) -> None:
    """An API error reaches each submitter of the batch, so none of them acknowledges anything."""
    api = FakeStatusApi(error=ApiError(503, "Unavailable", "etcd is down"))
    writer = _writer(api, 0.1)
    failures = 0
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)

        async def one() -> None:
            nonlocal failures
            with pytest.raises(ApiError):
                await writer.submit(_add(1))
            failures += 1

        async with anyio.create_task_group() as submitters:
            for _ in range(3):
                submitters.start_soon(one)
        writer.close()
    assert failures == 3
    assert api.value == 0


async def test_a_change_whose_submitter_gave_up_before_the_write_is_skipped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A cancelled submitter's change is not written when its batch has not started."""
    api = FakeStatusApi()
    writer = _writer(api, 1.0)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        with anyio.move_on_after(0.5):
            await writer.submit(_add(5))
        assert await writer.submit(_add(1)) == 1
        writer.close()
    assert api.value == 1


@pytest.mark.parametrize(
    ("error", "reported"),
    [
        (ApiError(500, "InternalError", "etcdserver: request is too large"), True),
        (ApiError(413, "RequestEntityTooLarge", "Request entity too large: limit is 3145728"), True),
        (ApiError(500, "InternalError", "etcdserver: leader changed"), False),
    ],
)
async def test_a_status_too_large_is_reported_once_until_a_write_succeeds(
    error: ApiError, reported: bool, autojump_clock: trio.testing.MockClock
) -> None:
    """Size refusals call the hook once per episode; other errors never; only a real write ends an episode."""
    api = FakeStatusApi(error=error)
    told: list[ApiError] = []

    async def tell(exc: ApiError) -> None:
        told.append(exc)

    writer = StatusWriter(cast("Kube", api), NODES, "job", window=0.0, log=structlog.get_logger(), on_too_large=tell)
    async with anyio.create_task_group() as tg:
        tg.start_soon(writer.run)
        for _ in range(3):
            with pytest.raises(ApiError):
                await writer.submit(_add(1))
            assert await writer.submit(_nothing) == "unchanged"  # answered, but nothing was written
        api.error = None
        assert await writer.submit(_add(1)) == 1
        api.error = error
        with pytest.raises(ApiError):
            await writer.submit(_add(1))
        writer.close()
    assert told == ([error, error] if reported else [])
