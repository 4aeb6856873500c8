"""Who asks for autonomy, and the Autonomy condition's state machine, as OpenYurt's check decides them."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.autonomy import (
    AUTONOMY_ANNOTATION,
    DURATION_ANNOTATION,
    FAILED_CHECKS_BEFORE_UNKNOWN,
    MAX_ERRORS_SHOWN,
    AutonomyCheck,
    AutonomyRequest,
    autonomy_request,
    check,
    parse_go_duration,
)
from nodetask.phases import ConditionStatus


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0", 0.0),
        ("0s", 0.0),
        ("-0", 0.0),
        ("300ms", 0.3),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("5.s", 5.0),
        ("-1m", -60.0),
        ("+2s", 2.0),
        ("1h2m3s4ms5us6ns", 3723.004005006),
        ("1µs", 1e-6),
        ("1μs", 1e-6),
    ],
)
def test_go_durations_read_as_go_reads_them(text: str, seconds: float) -> None:
    """Durations Go's time.ParseDuration accepts give the same number of seconds."""
    assert parse_go_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "1", "1x", "h", ".s", "1h ", " 1h", "1 h", "--1s", "1.2.3s", "1d", "forever"])
def test_durations_go_refuses_are_errors_naming_the_text(text: str) -> None:
    """What Go refuses is a ValueError quoting the text."""
    with pytest.raises(ValueError, match="invalid duration"):
        parse_go_duration(text)


@given(st.integers(0, 10_000), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_a_go_formatted_duration_parses_back(hours: int, minutes: int, secs: int, millis: int) -> None:
    """A duration written as Go's Duration.String() writes one reads back to its seconds."""
    text = f"{hours}h{minutes}m{secs}.{millis:03d}s"
    assert parse_go_duration(text) == pytest.approx(hours * 3600 + minutes * 60 + secs + millis / 1000)


@pytest.mark.parametrize(
    ("annotations", "request_"),
    [
        ({}, AutonomyRequest(requested=False)),
        ({AUTONOMY_ANNOTATION: "true"}, AutonomyRequest(requested=True)),
        ({AUTONOMY_ANNOTATION: "false"}, AutonomyRequest(requested=False)),
        ({DURATION_ANNOTATION: "0"}, AutonomyRequest(requested=True)),
        ({DURATION_ANNOTATION: "-5m"}, AutonomyRequest(requested=True)),
        ({DURATION_ANNOTATION: "1h"}, AutonomyRequest(requested=True, duration=3600.0)),
        ({AUTONOMY_ANNOTATION: "true", DURATION_ANNOTATION: "1h"}, AutonomyRequest(requested=True)),
    ],
)
def test_a_node_asks_for_autonomy_with_either_annotation(
    annotations: dict[str, str], request_: AutonomyRequest
) -> None:
    """The seed's annotation asks forever; a duration of zero or less too; a positive one bounds the tolerations."""
    assert autonomy_request(annotations) == request_


def test_an_unparsable_duration_asks_for_nothing_and_says_why() -> None:
    """OpenYurt treats an unparsable duration as not autonomous; the reason is kept for the log."""
    got = autonomy_request({DURATION_ANNOTATION: "a while"})
    assert not got.requested
    assert DURATION_ANNOTATION in got.problem
    assert "'a while'" in got.problem


checks = st.lists(st.tuples(st.booleans(), st.integers(0, 15)), max_size=30)


@given(checks)
def test_the_condition_follows_openyurts_state_machine(steps: list[tuple[bool, int]]) -> None:
    """False while not requested, True with no errored key, Unknown only after over three failing checks in a row."""
    state = AutonomyCheck()
    streak = 0
    expected: ConditionStatus | None = None
    for requested, errored in steps:
        errors = {f"pods/ns/p{i}": "no space left on device" for i in range(errored)}
        state = check(state, requested=requested, errors=errors)
        if not requested:
            streak, expected = 0, ConditionStatus.FALSE
        elif not errored:
            streak, expected = 0, ConditionStatus.TRUE
        else:
            streak += 1
            if streak > FAILED_CHECKS_BEFORE_UNKNOWN:
                expected = ConditionStatus.UNKNOWN
        assert (state.verdict.status if state.verdict else None) == expected
        assert state.failing == streak


def test_the_fourth_failing_check_turns_the_condition_unknown_with_the_errors_sorted_and_capped() -> None:
    """Three failing checks keep True; the fourth is Unknown/cache failed naming the first keys in order."""
    state = check(AutonomyCheck(), requested=True, errors={})
    errors = {f"pods/ns/p{i:02d}": "disk full" for i in range(MAX_ERRORS_SHOWN + 5)}
    for _ in range(FAILED_CHECKS_BEFORE_UNKNOWN):
        state = check(state, requested=True, errors=errors)
        assert state.verdict is not None
        assert state.verdict.status is ConditionStatus.TRUE
    state = check(state, requested=True, errors=errors)
    assert state.verdict is not None
    assert (state.verdict.status, state.verdict.reason) == (ConditionStatus.UNKNOWN, "cache failed")
    lines = state.verdict.message.split("\n")
    assert lines[0] == "pods/ns/p00: disk full"
    assert lines[-1] == "... and 5 more errored keys"
    assert len(lines) == MAX_ERRORS_SHOWN + 1
    state = check(state, requested=True, errors={})
    assert state.verdict is not None
    assert state.verdict.status is ConditionStatus.TRUE
