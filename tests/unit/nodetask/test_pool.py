"""The per-job pool never exceeds its concurrency and ends every node task exactly once."""

from __future__ import annotations

import heapq
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import anyio
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from nodetask.pool import JobPool, NodeTaskEnd, open_job_pool


@dataclass
class Recorder:
    """Records what the pool does, for assertions."""

    pool: JobPool | None = None
    dispatched: dict[str, float] = field(default_factory=dict)
    ended: dict[str, tuple[NodeTaskEnd, float]] = field(default_factory=dict)
    end_calls: int = 0
    max_in_flight: int = 0

    def work(self, node: str, seconds: float) -> Callable[[], Awaitable[None]]:
        async def body() -> None:
            assert self.pool is not None
            self.dispatched[node] = anyio.current_time()
            self.max_in_flight = max(self.max_in_flight, self.pool.in_flight)
            await anyio.sleep(seconds)

        return body

    def on_end(self, node: str, end: NodeTaskEnd) -> None:
        self.end_calls += 1
        assert node not in self.ended, f"{node} ended twice"
        self.ended[node] = (end, anyio.current_time())


async def test_concurrency_limits_dispatch(autojump_clock: trio.testing.MockClock) -> None:
    """With concurrency 2, five 10-second tasks dispatch two at a time and finish at 30 s."""
    rec = Recorder()
    async with open_job_pool(uid="u1", concurrency=2) as pool:
        rec.pool = pool
        for i in range(5):
            assert pool.start(f"n{i}", rec.work(f"n{i}", 10), timeout=300, on_end=rec.on_end)
    assert trio.current_time() == 30
    assert rec.dispatched == {"n0": 0, "n1": 0, "n2": 10, "n3": 10, "n4": 20}
    assert rec.max_in_flight == 2
    assert pool.peak_in_flight == 2
    assert {end for end, _ in rec.ended.values()} == {NodeTaskEnd.FINISHED}


@pytest.mark.parametrize("concurrency", [0, -3])
async def test_non_positive_concurrency_means_one(concurrency: int, autojump_clock: trio.testing.MockClock) -> None:
    """concurrency <= 0 behaves as 1, as in KubeEdge."""
    rec = Recorder()
    async with open_job_pool(uid="u", concurrency=concurrency) as pool:
        rec.pool = pool
        assert pool.limit == 1
        for i in range(3):
            pool.start(f"n{i}", rec.work(f"n{i}", 1), timeout=10, on_end=rec.on_end)
    assert rec.max_in_flight == 1
    assert trio.current_time() == 3


async def test_timeout_counts_from_dispatch_not_from_queueing(autojump_clock: trio.testing.MockClock) -> None:
    """Queued nodes are not timed out for waiting: each has its whole timeout once dispatched."""
    rec = Recorder()
    async with open_job_pool(uid="u", concurrency=1) as pool:
        rec.pool = pool
        pool.start("a", rec.work("a", 8), timeout=10, on_end=rec.on_end)
        pool.start("b", rec.work("b", 8), timeout=10, on_end=rec.on_end)
        pool.start("c", rec.work("c", 50), timeout=10, on_end=rec.on_end)
        pool.start("d", rec.work("d", 1), timeout=10, on_end=rec.on_end)
    assert rec.ended == {
        "a": (NodeTaskEnd.FINISHED, 8),
        "b": (NodeTaskEnd.FINISHED, 16),
        "c": (NodeTaskEnd.TIMED_OUT, 26),
        "d": (NodeTaskEnd.FINISHED, 27),
    }


async def test_interrupt_cancels_every_holder_and_waits_for_unwinding(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Interrupting ends in-flight and queued tasks as interrupted; wait_closed returns after all ended."""
    rec = Recorder()
    async with anyio.create_task_group() as tg:

        async def owner(*, task_status: anyio.abc.TaskStatus[JobPool]) -> None:
            async with open_job_pool(uid="u", concurrency=2) as pool:
                rec.pool = pool
                for i in range(4):
                    pool.start(f"n{i}", rec.work(f"n{i}", 100), timeout=300, on_end=rec.on_end)
                task_status.started(pool)

        pool = await tg.start(owner)
        await anyio.sleep(5)
        assert pool.in_flight == 2
        assert pool.queued == 2
        pool.interrupt()
        await pool.wait_closed()
        assert trio.current_time() == 5
        assert rec.ended == {f"n{i}": (NodeTaskEnd.INTERRUPTED, 5) for i in range(4)}
        assert pool.in_flight == 0
        assert not pool.start("late", rec.work("late", 1), timeout=1)


async def test_same_node_is_started_once_per_pool(autojump_clock: trio.testing.MockClock) -> None:
    """A second start for a node already in the pool is refused, so no node is dispatched twice."""
    rec = Recorder()
    async with open_job_pool(uid="u", concurrency=3) as pool:
        rec.pool = pool
        assert pool.start("n", rec.work("n", 1), timeout=5, on_end=rec.on_end)
        assert not pool.start("n", rec.work("n", 1), timeout=5, on_end=rec.on_end)
        assert "n" in pool
    assert rec.end_calls == 1


async def test_a_failing_body_is_reported_and_propagates(autojump_clock: trio.testing.MockClock) -> None:
    """A node body that raises ends as failed, releases its token, and the error reaches the pool's owner."""
    rec = Recorder()

    async def boom() -> None:
        raise RuntimeError("edge exploded")

    with pytest.RaisesGroup(pytest.RaisesExc(RuntimeError, match="edge exploded")):
        async with open_job_pool(uid="u", concurrency=1) as pool:
            rec.pool = pool
            pool.start("bad", boom, timeout=5, on_end=rec.on_end)
            pool.start("next", rec.work("next", 1), timeout=5, on_end=rec.on_end)
    assert rec.ended["bad"][0] is NodeTaskEnd.FAILED
    assert rec.ended["next"][0] is NodeTaskEnd.INTERRUPTED
    assert pool.in_flight == 0


# ------------------------------------------------------------------------------------------ model check


@dataclass(frozen=True)
class Program:
    concurrency: int
    durations: tuple[int, ...]
    """Seconds each node task's body runs, in start order."""
    timeout: float
    interrupt_at: float | None


programs = st.builds(
    Program,
    concurrency=st.integers(-1, 5),
    durations=st.lists(st.integers(0, 30), max_size=12).map(tuple),
    timeout=st.integers(1, 30).map(lambda t: t + 0.5),  # never equal to a duration: no ties
    interrupt_at=st.one_of(st.none(), st.integers(0, 120).map(lambda t: t + 0.25)),
)


def _model(p: Program) -> dict[str, tuple[NodeTaskEnd, float, float | None]]:
    """Expected (end, end time, dispatch time) per node under FIFO token hand-over."""
    limit = max(p.concurrency, 1)
    free_at = [0.0] * limit
    heapq.heapify(free_at)
    out: dict[str, tuple[NodeTaskEnd, float, float | None]] = {}
    for i, duration in enumerate(p.durations):
        start = heapq.heappop(free_at)
        held = min(duration, p.timeout)
        end_time = start + held
        kind = NodeTaskEnd.FINISHED if duration < p.timeout else NodeTaskEnd.TIMED_OUT
        if p.interrupt_at is not None and (start >= p.interrupt_at or end_time > p.interrupt_at):
            dispatched = start if start < p.interrupt_at else None
            out[f"n{i}"] = (NodeTaskEnd.INTERRUPTED, p.interrupt_at, dispatched)
            heapq.heappush(free_at, p.interrupt_at)
        else:
            out[f"n{i}"] = (kind, end_time, start)
            heapq.heappush(free_at, end_time)
    return out


@settings(max_examples=150, deadline=None)
@given(programs)
def test_pool_matches_the_fifo_model(program: Program) -> None:
    """In-flight never exceeds the limit, every node ends exactly once, at the time and in the way the model says."""
    rec = Recorder()

    async def main() -> None:
        async with open_job_pool(uid="u", concurrency=program.concurrency) as pool:
            rec.pool = pool
            for i, duration in enumerate(program.durations):
                pool.start(f"n{i}", rec.work(f"n{i}", duration), timeout=program.timeout, on_end=rec.on_end)
            if program.interrupt_at is not None:
                await anyio.sleep(program.interrupt_at)
                pool.interrupt()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    expected = _model(program)
    assert rec.end_calls == len(program.durations)
    assert {n: (e, t) for n, (e, t, _) in expected.items()} == rec.ended
    assert {n: d for n, (_, _, d) in expected.items() if d is not None} == rec.dispatched
    assert rec.max_in_flight <= max(program.concurrency, 1)


async def test_a_task_waiting_outside_the_pool_lends_its_token_to_the_next_and_takes_one_back_in_turn(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """With concurrency 1, a task lending its token lets the one queued behind it run; it then resumes holding one."""
    order: list[str] = []
    slot_free = anyio.Event()

    async with open_job_pool(uid="u", concurrency=1) as pool:

        async def waiting() -> None:
            order.append("waiting: has token")
            async with pool.token_lent():
                order.append("waiting: lent")
                await slot_free.wait()
            order.append(f"waiting: has token again ({pool.in_flight} in flight)")

        async def adopted() -> None:
            order.append(f"adopted: runs ({pool.in_flight} in flight)")
            await anyio.sleep(1)
            slot_free.set()
            await anyio.sleep(1)
            order.append("adopted: done")

        pool.start("pending", waiting, timeout=math.inf)
        pool.start("adopted", adopted, timeout=math.inf)
    assert order == [
        "waiting: has token",
        "waiting: lent",
        "adopted: runs (1 in flight)",
        "adopted: done",
        "waiting: has token again (1 in flight)",
    ]
    assert pool.peak_in_flight == 1
    assert pool.ended == {"adopted": NodeTaskEnd.FINISHED, "pending": NodeTaskEnd.FINISHED}


async def test_a_task_cancelled_while_lending_its_token_leaves_without_giving_one_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A timeout inside the lent block ends the task; the pool's tokens stay balanced for the next one."""
    ran: list[str] = []

    async with open_job_pool(uid="u", concurrency=1) as pool:

        async def stuck() -> None:
            async with pool.token_lent():
                await anyio.sleep_forever()

        async def holder() -> None:
            await anyio.sleep(10)  # holds the token when the stuck one times out and would take it back
            ran.append("holder")

        async def after() -> None:
            ran.append(f"after ({pool.in_flight} in flight)")

        pool.start("stuck", stuck, timeout=5)
        pool.start("holder", holder, timeout=math.inf)
        pool.start("after", after, timeout=math.inf)
    assert ran == ["holder", "after (1 in flight)"]
    assert pool.ended["stuck"] is NodeTaskEnd.TIMED_OUT
    assert pool.peak_in_flight == 1
