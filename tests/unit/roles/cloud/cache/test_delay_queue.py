"""The cache streams' job queue: due order, jobs put first, one worker woken per job."""

from __future__ import annotations

import anyio
import trio.testing

from roles.cloud.cache.delay_queue import DelayQueue


async def test_jobs_come_out_when_due_first_ones_ahead_of_the_rest(autojump_clock: trio.testing.MockClock) -> None:
    """Ready jobs in order with ``first`` ones ahead; delayed ones once due, each at its time."""
    queue: DelayQueue[str] = DelayQueue()
    taken: list[tuple[str, float]] = []
    async with anyio.create_task_group() as tg:
        await tg.start(queue.run)
        queue.put("later", 5)
        queue.put("sooner", 2, first=True)
        queue.put("a")
        queue.put("b")
        queue.put("urgent", first=True)
        while len(taken) < 5:
            taken.append((await queue.get(), anyio.current_time()))
        tg.cancel_scope.cancel()
    assert taken == [("urgent", 0.0), ("a", 0.0), ("b", 0.0), ("sooner", 2.0), ("later", 5.0)]
    assert len(queue) == 0


async def test_each_job_wakes_one_waiting_worker(autojump_clock: trio.testing.MockClock) -> None:
    """Three workers waiting and two jobs put: two workers take one each, the third keeps waiting."""
    queue: DelayQueue[int] = DelayQueue()
    got: list[int] = []

    async def worker() -> None:
        got.append(await queue.get())

    async with anyio.create_task_group() as tg:
        for _ in range(3):
            tg.start_soon(worker)
        await anyio.sleep(1)
        queue.put(1)
        queue.put(2)
        await anyio.sleep(1)
        assert sorted(got) == [1, 2]
        tg.cancel_scope.cancel()
