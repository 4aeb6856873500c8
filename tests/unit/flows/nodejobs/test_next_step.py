"""The device's choice of the next action is a pure function of the flow, the result and the spec."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flows.nodejobs import configupdatejob, imageprepulljob, nodeupgradejob
from flows.nodejobs.jobtype import JobType, NextStep, next_step, resume_at
from schemas.v1alpha2 import NodeUpgradeJobSpec

JOB_TYPES = (nodeupgradejob.JOB_TYPE, imageprepulljob.JOB_TYPE, configupdatejob.JOB_TYPE)
CONFIRMING = NodeUpgradeJobSpec(version="v1.0.0", require_confirmation=True)
NOT_CONFIRMING = NodeUpgradeJobSpec(version="v1.0.0")


def walk(jt: JobType, results: list[bool]) -> list[tuple[str, bool]]:
    """The actions a task runs from the flow's start when its actions end with ``results`` in turn."""
    ran: list[tuple[str, bool]] = []
    action: str | None = jt.flow.first
    for succ in results:
        if action is None:
            break
        ran.append((action, succ))
        action = jt.flow.next(action, succ)
    return ran


@given(jt=st.sampled_from(JOB_TYPES), data=st.data(), succ=st.booleans(), confirm=st.booleans())
def test_the_next_action_follows_the_flow_and_pauses_only_at_the_confirmation_point(
    jt: JobType, data: st.DataObject, succ: bool, confirm: bool
) -> None:
    """The next action is the flow's; a pause happens only after the confirmation action succeeded and the spec asks."""
    action = data.draw(st.sampled_from(jt.flow.actions))
    spec = CONFIRMING if confirm else NOT_CONFIRMING
    step = next_step(jt, spec, action, succ)
    assert step.action == jt.flow.next(action, succ)
    expected_pause = (
        jt is nodeupgradejob.JOB_TYPE and confirm and succ and action == nodeupgradejob.WAITING_CONFIRMATION
    )
    assert step.pause is expected_pause


def test_an_action_the_flow_does_not_know_ends_the_task() -> None:
    """A stored task naming an action its flow lacks finishes (its failure is reported), never loops."""
    assert next_step(imageprepulljob.JOB_TYPE, None, "Upgrade", True) == NextStep(None)


@given(jt=st.sampled_from(JOB_TYPES), results=st.lists(st.booleans(), max_size=8), cut=st.integers(0, 8))
def test_a_resumed_task_skips_exactly_the_actions_already_recorded(jt: JobType, results: list[bool], cut: int) -> None:
    """After a restart, a task resumes at the first action of its walk with no recorded result."""
    ran = walk(jt, results)
    recorded = ran[:cut]
    done = dict(recorded)
    resumed = resume_at(jt, jt.flow.first, done)
    if len(recorded) < len(ran):
        assert resumed == ran[len(recorded)][0]
    elif recorded:
        last, succ = recorded[-1]
        assert resumed == jt.flow.next(last, succ)
    else:
        assert resumed == jt.flow.first
    assert resumed is None or resumed not in done


def test_only_agent_changing_job_types_hold_the_exclusive_slot() -> None:
    """NodeUpgradeJob and ConfigUpdateJob hold the node's one slot; a pre-pull never does."""
    assert [jt.exclusive for jt in JOB_TYPES] == [True, False, True]
