"""The edge store keeps tasks, progress, reports and the exclusive slot across restarts, and fails cleanly."""

from __future__ import annotations

import itertools
import sqlite3
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import anyio
import msgspec
import pytest
import structlog
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roles.edge.store.records import TaskNotFoundError, TaskState
from roles.edge.store.schema import store_error
from roles.edge.store.store import SCHEMA_VERSION, EdgeStore, StoreError, StoreFault, open_store, quarantine_store
from tests.unit.roles.edge.store.task_builders import ROUTE, add, progress, ticking_clock


async def test_tasks_progress_and_outbox_survive_a_restart(tmp_path: Path) -> None:
    """Close and reopen: tasks, their progress and the outbox (in seq order) are all still there."""
    path = tmp_path / "data" / "store.sqlite"
    async with open_store(path, now=ticking_clock()) as store:
        await add(store, "u1")
        await add(store, "u2")
        first = await store.record_result(progress("u1", "Check"), state=TaskState.RUNNING, current_action="BackUp")
        second = await store.record_result(progress("u1", "WaitingConfirmation"), state=TaskState.WAITING_CONFIRMATION)
        third = await store.append(route=ROUTE, job_uid="u2", action="Check", succ=False, reason="cpu")
        tasks_before = await store.tasks()
    async with open_store(path) as store:
        assert await store.tasks() == tasks_before
        u1 = await store.get_task("u1")
        assert u1 is not None
        assert (u1.state, u1.current_action) == (TaskState.WAITING_CONFIRMATION, "WaitingConfirmation")
        assert u1.received_at == datetime(2026, 1, 1, tzinfo=UTC)
        assert u1.spec == b'{"version":"v1.2.3"}'
        assert [p.action for p in await store.progress("u1")] == ["Check", "WaitingConfirmation"]
        assert await store.pending() == (first, second, third)
        assert [r.seq for r in (first, second, third)] == [1, 2, 3]


async def test_a_redelivered_task_keeps_what_was_first_stored(tmp_path: Path) -> None:
    """A second RunAction for a known job UID changes nothing and says it stored nothing."""
    async with open_store(tmp_path / "s.sqlite") as store:
        stored, new = await store.add_task(
            job_uid="u1", route=ROUTE, job_type="nodeupgradejob", spec=b"{}", run_action_id="r1", action="Check"
        )
        again, new_again = await store.add_task(
            job_uid="u1", route=ROUTE, job_type="nodeupgradejob", spec=b"{}", run_action_id="r2", action="BackUp"
        )
    assert (new, new_again) == (True, False)
    assert again == stored


async def test_recording_a_result_updates_progress_outbox_and_task_at_once(tmp_path: Path) -> None:
    """One call records the result, queues the matching report and moves the task; re-recording replaces it."""
    async with open_store(tmp_path / "s.sqlite") as store:
        await add(store, "u1", action="Upgrade")
        failed = await store.record_result(
            progress("u1", "Upgrade", succ=False), state=TaskState.RUNNING, current_action="RollBack"
        )
        assert failed.route == ROUTE
        assert (failed.action, failed.succ) == ("Upgrade", False)
        again = await store.record_result(progress("u1", "Upgrade", extend="v1,v2"), state=TaskState.FINISHED)
        assert await store.progress("u1") == (progress("u1", "Upgrade", extend="v1,v2"),)
        assert [r.seq for r in await store.pending()] == [failed.seq, again.seq]
        task = await store.get_task("u1")
        assert task is not None
        assert (task.state, task.current_action) == (TaskState.FINISHED, "Upgrade")
        moved = await store.set_task_state("u1", state=TaskState.RUNNING, current_action="BackUp")
        assert moved == await store.get_task("u1")


async def test_a_result_for_an_unknown_task_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    """Recording for a job UID never received raises TaskNotFoundError and queues no report."""
    async with open_store(tmp_path / "s.sqlite") as store:
        with pytest.raises(TaskNotFoundError, match="'ghost'"):
            await store.record_result(progress("ghost", "Check"), state=TaskState.RUNNING)
        with pytest.raises(TaskNotFoundError):
            await store.set_task_state("ghost", state=TaskState.FINISHED, current_action="Check")
        assert await store.pending() == ()


async def test_seq_is_never_reused_after_acknowledging_the_last_and_reopening(tmp_path: Path) -> None:
    """With the outbox emptied and the store reopened, the next report still gets a new, higher seq."""
    path = tmp_path / "s.sqlite"
    async with open_store(path) as store:
        sent = [await store.append(route=ROUTE, job_uid="u", action="Check", succ=True) for _ in range(3)]
        for report in sent:
            assert await store.acknowledge(report.seq)
        assert not await store.acknowledge(sent[-1].seq)
    async with open_store(path) as store:
        assert await store.pending() == ()
        later = await store.append(route=ROUTE, job_uid="u", action="Check", succ=True)
    assert later.seq == sent[-1].seq + 1


async def test_pending_pages_by_seq(tmp_path: Path) -> None:
    """``after`` and ``limit`` give the sender the next page in seq order."""
    async with open_store(tmp_path / "s.sqlite") as store:
        seqs = [(await store.append(route=ROUTE, job_uid="u", action=f"a{i}", succ=True)).seq for i in range(5)]
        assert [r.seq for r in await store.pending(after=seqs[1], limit=2)] == seqs[2:4]
        assert [r.seq for r in await store.pending(limit=0)] == []


async def test_a_dropped_report_leaves_the_outbox_and_is_kept_with_its_reason(tmp_path: Path) -> None:
    """Dropping moves a report out of the outbox into the dropped list, once."""
    async with open_store(tmp_path / "s.sqlite", now=ticking_clock()) as store:
        keep = await store.append(route=ROUTE, job_uid="u", action="Check", succ=True)
        gone = await store.append(route=ROUTE, job_uid="u", action="Pull", succ=False, reason="x")
        assert await store.drop(gone.seq, "job_gone: the job no longer exists")
        assert not await store.drop(gone.seq, "again")
        assert await store.pending() == (keep,)
        (dropped,) = await store.dropped()
    assert dropped.report == gone
    assert dropped.reason == "job_gone: the job no longer exists"
    assert dropped.dropped_at == datetime(2026, 1, 1, tzinfo=UTC), "appending reads no clock; dropping does"


async def test_one_exclusive_operation_at_a_time_across_restarts(tmp_path: Path) -> None:
    """A second task is refused with the holder's description, even after a restart, until the holder ends."""
    path = tmp_path / "s.sqlite"
    async with open_store(path, now=ticking_clock()) as store:
        await add(store, "u1")
        await add(store, "u2")
        assert await store.try_begin_exclusive("u1", "upgrade") is None
    async with open_store(path) as store:
        refusal = await store.try_begin_exclusive("u2", "config_update")
        assert refusal == f"upgrade {ROUTE} (job u1) since 2026-01-01T00:00:02+00:00"
        assert await store.try_begin_exclusive("u1", "upgrade") is None, "the holder may resume after a restart"
        assert not await store.end_exclusive("u2")
        assert await store.end_exclusive("u1")
        assert await store.try_begin_exclusive("u2", "config_update") is None
        hold = await store.exclusive_hold()
        assert hold is not None
        assert (hold.job_uid, hold.kind) == ("u2", "config_update")
        with pytest.raises(TaskNotFoundError):
            await store.try_begin_exclusive("ghost", "upgrade")


async def test_removing_a_task_drops_its_progress_and_hold_but_not_its_reports(tmp_path: Path) -> None:
    """A forgotten task can never block the node; its queued reports are still delivered."""
    async with open_store(tmp_path / "s.sqlite") as store:
        await add(store, "u1")
        report = await store.record_result(progress("u1", "Check"), state=TaskState.FINISHED)
        await store.try_begin_exclusive("u1", "upgrade")
        assert await store.remove_task("u1")
        assert not await store.remove_task("u1")
        assert await store.get_task("u1") is None
        assert await store.progress("u1") == ()
        assert await store.exclusive_hold() is None
        assert await store.pending() == (report,)


async def test_pruning_forgets_only_old_finished_tasks_whose_reports_are_acknowledged(tmp_path: Path) -> None:
    """Old, finished and acknowledged: gone with its progress; running, recent, unacknowledged or holding: kept."""
    async with open_store(tmp_path / "s.sqlite", now=ticking_clock()) as store:
        for uid in ("done", "running", "unacked", "holding", "recent"):
            await add(store, uid)  # received at 00:00:00 .. 00:00:04
        for uid in ("done", "unacked", "holding", "recent"):
            report = await store.record_result(progress(uid, "Check"), state=TaskState.FINISHED)
            if uid != "unacked":
                await store.acknowledge(report.seq)
        await store.try_begin_exclusive("holding", "upgrade")
        cutoff = datetime(2026, 1, 1, 0, 0, 4, tzinfo=UTC)  # "recent" was received at the cutoff
        assert await store.prune_finished(cutoff) == 1
        assert await store.get_task("done") is None
        assert await store.progress("done") == ()
        assert {t.job_uid for t in await store.tasks()} == {"running", "unacked", "holding", "recent"}
        assert await store.prune_finished(cutoff) == 0


class UpgradeRecord(msgspec.Struct, frozen=True):
    job_uid: str
    to_version: str


async def test_facts_round_trip_as_typed_values(tmp_path: Path) -> None:
    """A fact comes back as the type asked for; asking for the wrong type is a StoreError naming the key."""
    path = tmp_path / "s.sqlite"
    async with open_store(path) as store:
        await store.set_fact("pending_upgrade", UpgradeRecord(job_uid="u1", to_version="v1.21.0"))
        await store.set_fact("installed_version", "v1.20.0")
        await store.set_fact("installed_version", "v1.21.0")
    async with open_store(path) as store:
        assert await store.get_fact("pending_upgrade", UpgradeRecord) == UpgradeRecord("u1", "v1.21.0")
        assert await store.get_fact("installed_version", str) == "v1.21.0"
        assert await store.get_fact("missing", str) is None
        with pytest.raises(StoreError, match="fact 'installed_version'") as caught:
            await store.get_fact("installed_version", int)
        assert caught.value.fault is StoreFault.SCHEMA
        assert await store.delete_fact("pending_upgrade")
        assert not await store.delete_fact("pending_upgrade")


async def test_a_full_disk_fails_the_whole_write_and_keeps_everything_before(tmp_path: Path) -> None:
    """When the file cannot grow, the failing result leaves no progress, no report and no task change."""
    path = tmp_path / "s.sqlite"
    async with open_store(path) as store:
        await add(store, "u1")
        kept = await store.record_result(progress("u1", "Check"), state=TaskState.RUNNING, current_action="Pull")
    page = 4096
    # Room for the progress row's overflow pages but not for the report's: the write fails half-way.
    big = "x" * (3 * page)
    async with open_store(path, max_bytes=path.stat().st_size + 5 * page) as store:
        with pytest.raises(StoreError) as caught:
            await store.record_result(progress("u1", "Pull", extend=big), state=TaskState.FINISHED)
        assert caught.value.fault is StoreFault.FULL
        assert str(caught.value) == f"edge store {path} is full: database or disk is full"
        assert await store.pending() == (kept,)
        assert await store.progress("u1") == (progress("u1", "Check"),)
        task = await store.get_task("u1")
        assert task is not None
        assert (task.state, task.current_action) == (TaskState.RUNNING, "Pull")
        small = await store.record_result(progress("u1", "Pull"), state=TaskState.FINISHED)
        assert await store.pending() == (kept, small), "the store stays usable after the failure"


async def test_a_path_that_cannot_be_opened_is_a_store_error_naming_it(tmp_path: Path) -> None:
    """A store whose directory is a regular file fails to open with the path and the cause."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_bytes(b"")
    with pytest.raises(StoreError, match=f"edge store {blocker / 'store.sqlite'} cannot be opened") as caught:
        async with open_store(blocker / "store.sqlite"):
            pass
    assert caught.value.fault is StoreFault.CANNOT_OPEN


def test_a_read_only_database_maps_to_a_read_only_store_error(tmp_path: Path) -> None:
    """SQLite's readonly failure becomes a StoreError saying the store is read-only, with SQLite's text."""
    path = tmp_path / "ro.sqlite"
    with sqlite3.connect(path) as setup:
        setup.execute("CREATE TABLE t (x)")
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    with pytest.raises(sqlite3.OperationalError) as raised:
        conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    error = store_error(path, raised.value)
    assert error.fault is StoreFault.READ_ONLY
    assert str(error) == f"edge store {path} is read-only: attempt to write a readonly database"


async def test_a_corrupt_file_is_a_store_error_and_can_be_quarantined(tmp_path: Path) -> None:
    """A file that is not a database fails to open naming it; moved aside, a fresh store opens in its place."""
    path = tmp_path / "store.sqlite"
    path.write_bytes(b"definitely not sqlite " * 100)
    with pytest.raises(StoreError, match=f"edge store {path} is corrupt or not a database") as caught:
        async with open_store(path):
            pass
    assert caught.value.fault is StoreFault.CORRUPT
    with structlog.testing.capture_logs() as logs:
        moved = await quarantine_store(path, now=lambda: datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC))
    assert moved == tmp_path / "store.sqlite.corrupt-20260304T050607Z"
    assert moved.read_bytes().startswith(b"definitely not sqlite")
    assert logs[0]["event"] == "store_quarantined"
    async with open_store(path) as store:
        assert await store.pending() == ()


async def test_a_newer_schema_opens_only_if_it_still_reads_as_ours(tmp_path: Path) -> None:
    """After a rollback, a store migrated by a newer agent opens if additive, and is refused otherwise."""
    path = tmp_path / "s.sqlite"
    async with open_store(path) as store:
        await store.append(route=ROUTE, job_uid="u", action="Check", succ=True)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    async with open_store(path) as store:
        assert len(await store.pending()) == 1
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE store_meta SET value = ? WHERE key = 'oldest_reader'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(StoreError, match=f"schema version {SCHEMA_VERSION + 1} needs an agent") as caught:
        async with open_store(path):
            pass
    assert caught.value.fault is StoreFault.SCHEMA


async def test_a_closed_store_refuses_calls(tmp_path: Path) -> None:
    """Using the store after its block ends raises ClosedResourceError instead of touching a closed connection."""
    async with open_store(tmp_path / "s.sqlite") as store:
        pass
    with pytest.raises(anyio.ClosedResourceError):
        await store.pending()
    await store.aclose()


async def test_many_concurrent_tasks_get_distinct_increasing_seqs(tmp_path: Path) -> None:
    """Fifty trio tasks appending and acknowledging at once leave exactly the unacknowledged reports."""
    async with open_store(tmp_path / "s.sqlite") as store:
        seqs: dict[int, list[int]] = {}

        async def writer(n: int) -> None:
            mine = seqs.setdefault(n, [])
            for i in range(3):
                mine.append((await store.append(route=ROUTE, job_uid=f"u{n}", action=f"a{i}", succ=True)).seq)
                await trio.lowlevel.checkpoint()
            assert await store.acknowledge(mine[0])

        async with trio.open_nursery() as nursery:
            for n in range(50):
                nursery.start_soon(writer, n)
        all_seqs = [s for mine in seqs.values() for s in mine]
        assert len(set(all_seqs)) == 150
        assert all(mine == sorted(mine) for mine in seqs.values())
        pending = await store.pending()
    assert [r.seq for r in pending] == sorted(s for mine in seqs.values() for s in mine[1:])


# ----------------------------------------------------------------------------- the outbox model

ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(["Check", "Pull", "Upgrade"])),
        st.tuples(st.just("ack"), st.integers(0, 8)),
        st.tuples(st.just("drop"), st.integers(0, 8)),
        st.tuples(st.just("reopen"), st.just("")),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_any_interleaving_keeps_the_outbox_equal_to_a_list(program: list[tuple[str, object]]) -> None:
    """Appends, acknowledgements (of pending or unknown seqs), drops and restarts keep pending() equal to a model."""
    model: list[tuple[int, str]] = []
    highest = 0

    async def run_until_restart(store: EdgeStore, steps: list[tuple[str, object]]) -> None:
        nonlocal highest
        for op, arg in steps:
            if op == "append":
                report = await store.append(route=ROUTE, job_uid="u", action=str(arg), succ=True)
                assert report.seq > highest
                highest = report.seq
                model.append((report.seq, str(arg)))
            else:
                index = int(str(arg))
                # Indexes past the end name a seq never handed out, or one already gone.
                seq = model[index][0] if index < len(model) else highest + 1 + index
                done = await store.acknowledge(seq) if op == "ack" else await store.drop(seq, "refused")
                assert done == (index < len(model))
                if done:
                    del model[index]
            assert [(r.seq, r.action) for r in await store.pending()] == model

    async def main(path: Path) -> None:
        lives = [
            list(group) for restart, group in itertools.groupby(program, lambda op: op[0] == "reopen") if not restart
        ]
        for steps in lives or [[]]:
            async with open_store(path) as store:
                assert [(r.seq, r.action) for r in await store.pending()] == model
                await run_until_restart(store, steps)

    with tempfile.TemporaryDirectory() as tmp:
        trio.run(main, Path(tmp) / "store.sqlite")


async def test_counts_say_what_the_rows_say_in_one_read(tmp_path: Path) -> None:
    """Tasks by state, reports waiting and dropped, and the bytes in use match the store's own readings."""
    async with open_store(tmp_path / "store.sqlite", now=ticking_clock()) as store:
        for uid in ("u1", "u2", "u3"):
            await add(store, uid)
        first = await store.record_result(progress("u1", "Check"), state=TaskState.WAITING_CONFIRMATION)
        await store.record_result(progress("u2", "Check", succ=False), state=TaskState.FINISHED)
        await store.drop(first.seq, "job_gone")
        counts = await store.counts()
        assert counts.tasks == {"running": 1, "waiting_confirmation": 1, "finished": 1}
        assert (
            (counts.outbox_depth, counts.dropped) == (await store.outbox_depth(), len(await store.dropped())) == (1, 1)
        )
        assert counts.used_bytes == await store.used_bytes() > 0
