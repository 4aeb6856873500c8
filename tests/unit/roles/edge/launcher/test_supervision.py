"""The launcher's decisions: when a version on probation is rolled back, restarted, or let be."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from roles.common.restart import EXIT_RESTART
from roles.edge.launcher.supervision import (
    DEADLINE_GRACE_S,
    EXIT_USAGE,
    MAX_FAILED_STARTS,
    Decision,
    Exited,
    Finish,
    Pause,
    Probation,
    Relaunch,
    RollBack,
    Start,
    Starting,
    Supervision,
    decide,
)
from roles.edge.upgrade.marker import MarkerState, UpgradeMarker

STATUSES = st.sampled_from([None, 0, 1, EXIT_USAGE, EXIT_RESTART, 137])
"""Exit statuses; None is an agent stopped at its probation's deadline."""


def _marker(job: str, state: MarkerState, deadline: float = 30.0) -> UpgradeMarker:
    return UpgradeMarker(
        job_uid=job,
        from_version="v0.1.0",
        to_version=f"v0.2.0-{job}",
        previous="",
        state=state,
        deadline_s=deadline,
        reason="",
    )


markers = st.none() | st.builds(
    _marker, st.sampled_from(["a", "b"]), st.sampled_from(MarkerState), st.sampled_from([0.5, 30.0])
)
states = st.builds(
    Supervision,
    grace=st.just(DEADLINE_GRACE_S),
    probation=st.none() | st.builds(Probation, st.sampled_from(["a", "b"]), st.floats(0, 1000)),
    failed_starts=st.integers(0, MAX_FAILED_STARTS - 1),
    run_on_probation=st.booleans(),
)


@dataclass(frozen=True, slots=True)
class Run:
    """One run of the agent as the test acts it out: how it exits, and the marker it leaves (None: untouched)."""

    status: int | None
    writes: UpgradeMarker | None


runs = st.lists(st.builds(Run, STATUSES, st.none() | markers.filter(lambda m: m is not None)), max_size=12)


def _drive(marker: UpgradeMarker | None, script: list[Run]) -> list[tuple[Decision, UpgradeMarker | None]]:
    """Run the machine as the launcher's shell does, over a scripted agent; each decision with the marker it saw.

    A rollback writes the marker ``rolled_back``, as the shell does. The loop time advances one
    second per start; an agent can only be stopped at a deadline (status None) when it had one.
    """
    state, now = Supervision(), 0.0
    seen: list[tuple[Decision, UpgradeMarker | None]] = []
    pending = list(script)
    event: Starting | Exited = Starting(marker, now)
    while len(seen) < 200:
        state, decision = decide(state, event)
        seen.append((decision, marker))
        if isinstance(decision, Finish):
            break
        if isinstance(decision, Start):
            if not pending:
                break
            run = pending.pop(0)
            marker = run.writes or marker
            status = 1 if run.status is None and decision.until is None else run.status
            event = Exited(status, marker)
            continue
        if isinstance(decision, RollBack):
            marker = msgspec.structs.replace(decision.marker, state=MarkerState.ROLLED_BACK)
        now += 1
        event = Starting(marker, now)
    return seen


@given(states, markers)
def test_a_restart_request_never_counts_as_a_failed_start(state: Supervision, marker: UpgradeMarker | None) -> None:
    """Exit 75 relaunches at once and leaves the count of failed starts as it was, on probation or not."""
    after, decision = decide(state, Exited(EXIT_RESTART, marker))
    assert decision == Relaunch(Pause.NONE)
    assert after.failed_starts == state.failed_starts


@given(states, markers)
def test_an_unhealthy_marker_is_rolled_back_before_anything_starts(
    state: Supervision, marker: UpgradeMarker | None
) -> None:
    """Before a start, a rollback happens exactly when the marker says unhealthy, with its reason or a default."""
    _, decision = decide(state, Starting(marker, 10.0))
    if marker is not None and marker.state is MarkerState.UNHEALTHY:
        assert decision == RollBack(marker, f"{marker.to_version} reported itself unhealthy")
    else:
        assert isinstance(decision, Start)


@given(states, STATUSES, markers)
def test_an_exit_is_rolled_back_exactly_when_its_probation_failed(
    state: Supervision, status: int | None, marker: UpgradeMarker | None
) -> None:
    """After a run, a rollback happens exactly when the run was on probation, the marker still says switched,
    and the agent either missed its deadline or failed its third start in a row."""
    after, decision = decide(state, Exited(status, marker))
    still_switched = state.run_on_probation and marker is not None and marker.state is MarkerState.SWITCHED
    failed_for_good = status is None or (status != EXIT_RESTART and state.failed_starts + 1 >= MAX_FAILED_STARTS)
    assert isinstance(decision, RollBack) is (still_switched and failed_for_good)
    if isinstance(decision, RollBack):
        assert decision.marker == marker
    elif still_switched and status != EXIT_RESTART:
        assert decision == Relaunch(Pause.RETRY)
        assert after.failed_starts == state.failed_starts + 1


@given(st.booleans(), STATUSES, markers)
def test_off_probation_a_clean_exit_or_a_config_error_ends_the_launcher_and_anything_else_relaunches(
    started_on_probation: bool, status: int | None, marker: UpgradeMarker | None
) -> None:
    """Unless a switch is being judged, exits 0 and 2 end the launcher, 75 relaunches at once, others back off."""
    if started_on_probation and marker is not None and marker.state is MarkerState.SWITCHED:
        marker = msgspec.structs.replace(marker, state=MarkerState.HEALTHY)
    _, decision = decide(Supervision(run_on_probation=started_on_probation), Exited(status, marker))
    if status in (0, EXIT_USAGE):
        assert decision == Finish(status)
    elif status == EXIT_RESTART:
        assert decision == Relaunch(Pause.NONE)
    else:
        assert decision == Relaunch(Pause.BACKOFF)


@given(st.sampled_from([0.5, 30.0]), st.lists(st.floats(0, 100), min_size=1, max_size=5))
def test_the_deadline_counts_from_the_first_start_of_a_switch_and_restarts_do_not_extend_it(
    deadline: float, gaps: list[float]
) -> None:
    """Every start of the same switch gets the same deadline; a new switch gets its own and a fresh count."""
    switched = _marker("a", MarkerState.SWITCHED, deadline)
    state, decision = decide(Supervision(), Starting(switched, 5.0))
    assert decision == Start(5.0 + deadline + DEADLINE_GRACE_S)
    now = 5.0
    for gap in gaps:
        now += gap
        state, _ = decide(state, Exited(1, switched))
        state, decision = decide(state, Starting(switched, now))
        assert decision == Start(5.0 + deadline + DEADLINE_GRACE_S)
    other = _marker("b", MarkerState.SWITCHED, deadline)
    state, decision = decide(state, Starting(other, now))
    assert decision == Start(now + deadline + DEADLINE_GRACE_S)
    assert state.failed_starts == 0


@given(markers, runs)
def test_one_switch_is_never_rolled_back_twice(marker: UpgradeMarker | None, script: list[Run]) -> None:
    """Between two rollbacks, the agent must have switched (or judged itself unhealthy) again."""
    rolled_since_switch = False
    marker_seen: UpgradeMarker | None = None
    for decision, seen in _drive(marker, script):
        if seen != marker_seen and seen is not None and seen.state in (MarkerState.SWITCHED, MarkerState.UNHEALTHY):
            rolled_since_switch = False
        marker_seen = seen
        if isinstance(decision, RollBack):
            assert not rolled_since_switch
            rolled_since_switch = True


@given(st.lists(st.sampled_from([1, 137, EXIT_USAGE, EXIT_RESTART]), max_size=8))
def test_a_switch_that_keeps_failing_to_start_is_rolled_back_at_its_third_failed_start(exits: list[int]) -> None:
    """Restart requests in between do not count: the rollback comes with the third exit that was not one."""
    switched = _marker("a", MarkerState.SWITCHED)
    decisions = [d for d, _ in _drive(switched, [Run(status, None) for status in [*exits, 1, 1, 1]])]
    rollbacks = [i for i, d in enumerate(decisions) if isinstance(d, RollBack)]
    assert len(rollbacks) == 1
    starts_before = [d for d in decisions[: rollbacks[0]] if isinstance(d, Start)]
    failed = [s for s in [*exits, 1, 1, 1][: len(starts_before)] if s != EXIT_RESTART]
    assert len(failed) == MAX_FAILED_STARTS
