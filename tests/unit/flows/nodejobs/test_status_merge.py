"""A report becomes exactly one actionFlow entry and a node phase that never moves backwards."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.nodejobs import configupdatejob, imageprepulljob, nodeupgradejob
from flows.nodejobs.jobtype import ExtendError, JobType, apply_result
from nodetask.flow import UnknownActionError
from nodetask.messages import ActionResult
from nodetask.phases import ConditionStatus, NodeTaskPhase
from schemas.v1alpha2 import (
    ConfigUpdateJobNodeTaskStatus,
    ImagePrePullNodeTaskStatus,
    ImageStatus,
    NodeUpgradeJobNodeTaskStatus,
)

NOW = "2026-11-25T10:00:00Z"


def _ok(action: str, extend: str = "", at: str = "2026-11-25T09:00:00Z") -> ActionResult:
    return ActionResult(action=action, succ=True, finish_time=at, extend=extend)


def _fail(action: str, reason: str = "boom") -> ActionResult:
    return ActionResult(action=action, succ=False, finish_time="2026-11-25T09:00:00Z", reason=reason)


def _upgrade_entry(phase: NodeTaskPhase = NodeTaskPhase.IN_PROGRESS) -> NodeUpgradeJobNodeTaskStatus:
    return NodeUpgradeJobNodeTaskStatus(node_name="edge-1", phase=phase)


def test_success_appends_one_entry_and_sets_versions() -> None:
    """A final Upgrade report appends {action, status True, time}, sets Successful and the versions."""
    jt = nodeupgradejob.JOB_TYPE
    entry = _upgrade_entry()
    for action in ("Check", "WaitingConfirmation", "BackUp"):
        entry = apply_result(jt, entry, _ok(action), now=NOW) or entry
        assert entry.phase is NodeTaskPhase.IN_PROGRESS
    done = apply_result(jt, entry, _ok("Upgrade", "v1.20.0,v1.21.0"), now=NOW)
    assert done is not None
    assert done.phase is NodeTaskPhase.SUCCESSFUL
    assert (done.historic_version, done.current_version) == ("v1.20.0", "v1.21.0")
    assert [a.action for a in done.action_flow] == ["Check", "WaitingConfirmation", "BackUp", "Upgrade"]
    assert done.action_flow[-1].status is ConditionStatus.TRUE
    assert done.action_flow[-1].time == "2026-11-25T09:00:00Z"


def test_failed_check_is_final_with_reason() -> None:
    """A failed Check has no failure edge: the node fails with the edge's reason, for every kind."""
    for jt, entry in (
        (nodeupgradejob.JOB_TYPE, _upgrade_entry()),
        (imageprepulljob.JOB_TYPE, ImagePrePullNodeTaskStatus(node_name="e", phase=NodeTaskPhase.IN_PROGRESS)),
        (configupdatejob.JOB_TYPE, ConfigUpdateJobNodeTaskStatus(node_name="e", phase=NodeTaskPhase.IN_PROGRESS)),
    ):
        out = apply_result(jt, entry, _fail("Check", "current cpu usage is 93.00, which exceeds"), now=NOW)
        assert out is not None
        assert out.phase is NodeTaskPhase.FAILURE
        assert out.reason == "current cpu usage is 93.00, which exceeds"
        assert out.action_flow[-1].status is ConditionStatus.FALSE
        assert out.action_flow[-1].reason == out.reason


def test_failed_upgrade_then_rollback_is_a_failure_saying_so() -> None:
    """Upgrade failing is not final; a successful RollBack ends the node as Failure 'rolled back'."""
    jt = nodeupgradejob.JOB_TYPE
    entry = _upgrade_entry()
    entry = apply_result(jt, entry, _fail("Upgrade", "new agent unhealthy"), now=NOW) or entry
    assert entry.phase is NodeTaskPhase.IN_PROGRESS
    rolled = apply_result(jt, entry, _ok("RollBack", "v1.21.0,v1.20.0"), now=NOW)
    assert rolled is not None
    assert rolled.phase is NodeTaskPhase.FAILURE
    assert rolled.reason == "the upgrade failed and the node was rolled back"
    assert rolled.current_version == "v1.20.0"


def test_a_rollback_that_says_what_failed_carries_it_into_the_nodes_reason() -> None:
    """A kubelet rollback's own reason (what was not healthy) follows the fixed text."""
    jt = nodeupgradejob.JOB_TYPE
    entry = apply_result(jt, _upgrade_entry(), _fail("Upgrade", "healthz does not answer"), now=NOW) or _upgrade_entry()
    said = ActionResult(
        action="RollBack", succ=True, finish_time="2026-11-25T09:00:00Z", reason="kubelet v1 runs again, v2 failed: x"
    )
    rolled = apply_result(jt, entry, said, now=NOW)
    assert rolled is not None
    assert rolled.phase is NodeTaskPhase.FAILURE
    assert rolled.reason == "the upgrade failed and the node was rolled back: kubelet v1 runs again, v2 failed: x"


def test_config_update_rollback_is_a_failure() -> None:
    """A config update that was rolled back did not happen: the node is Failure."""
    jt = configupdatejob.JOB_TYPE
    entry = ConfigUpdateJobNodeTaskStatus(node_name="e", phase=NodeTaskPhase.IN_PROGRESS)
    entry = apply_result(jt, entry, _fail("Update"), now=NOW) or entry
    out = apply_result(jt, entry, _ok("RollBack"), now=NOW)
    assert out is not None
    assert out.phase is NodeTaskPhase.FAILURE
    assert "restored" in out.reason


def test_prepull_extend_becomes_image_status() -> None:
    """Pull's extend, a JSON list of image results, replaces imageStatus."""
    jt = imageprepulljob.JOB_TYPE
    entry = ImagePrePullNodeTaskStatus(node_name="e", phase=NodeTaskPhase.IN_PROGRESS)
    images = (
        ImageStatus(image="nginx:1", status=ConditionStatus.TRUE),
        ImageStatus(image="nope:1", status=ConditionStatus.FALSE, reason="not found"),
    )
    report = ActionResult(
        action="Pull",
        succ=False,
        reason="there were some failures when pulling images",
        extend=imageprepulljob.encode_extend(images),
    )
    out = apply_result(jt, entry, report, now=NOW)
    assert out is not None
    assert out.image_status == images
    assert out.phase is NodeTaskPhase.FAILURE
    assert out.action_flow[-1].time == NOW  # no finishTime sent: the hub's time is recorded


def test_duplicate_report_adds_nothing() -> None:
    """Re-delivery of an applied report returns None: no second actionFlow entry."""
    jt = nodeupgradejob.JOB_TYPE
    entry = apply_result(jt, _upgrade_entry(), _ok("Check"), now=NOW)
    assert entry is not None
    assert apply_result(jt, entry, _ok("Check", at="2026-11-25T09:30:00Z"), now=NOW) is None


def test_late_report_is_recorded_in_flow_order_without_moving_the_phase() -> None:
    """A report overtaken by a later action is kept, in flow order, and does not change the phase."""
    jt = nodeupgradejob.JOB_TYPE
    entry = apply_result(jt, _upgrade_entry(), _ok("Upgrade", "v1,v2"), now=NOW)
    assert entry is not None
    assert entry.phase is NodeTaskPhase.SUCCESSFUL
    late = apply_result(jt, entry, _ok("Check"), now=NOW)
    assert late is not None
    assert [a.action for a in late.action_flow] == ["Check", "Upgrade"]
    assert late.phase is NodeTaskPhase.SUCCESSFUL


def test_unknown_is_revived_by_a_real_result() -> None:
    """A node the controller timed out (Unknown) takes the phase of a report that arrives later."""
    jt = nodeupgradejob.JOB_TYPE
    entry = NodeUpgradeJobNodeTaskStatus(
        node_name="e", phase=NodeTaskPhase.UNKNOWN, reason="The node task has timed out"
    )
    out = apply_result(jt, entry, _ok("Upgrade", "v1,v2"), now=NOW)
    assert out is not None
    assert (out.phase, out.reason) == (NodeTaskPhase.SUCCESSFUL, "")


def test_invalid_action_and_extend_raise() -> None:
    """An action outside the flow or a malformed extend is an error, not a silent change."""
    with pytest.raises(UnknownActionError, match="invalid nodeupgradejob action 'Pull'"):
        apply_result(nodeupgradejob.JOB_TYPE, _upgrade_entry(), _ok("Pull"), now=NOW)
    with pytest.raises(ExtendError, match="fromVersion,toVersion"):
        apply_result(nodeupgradejob.JOB_TYPE, _upgrade_entry(), _ok("Upgrade", "v1.21.0"), now=NOW)
    with pytest.raises(ExtendError, match="not a JSON list"):
        apply_result(imageprepulljob.JOB_TYPE, ImagePrePullNodeTaskStatus(node_name="e"), _ok("Pull", "{"), now=NOW)


def test_a_deeply_nested_extend_is_an_extend_error_naming_the_limit() -> None:
    """A Pull's extend nested 10,000 deep is refused like any malformed one, not a RecursionError in the hub."""
    deep = "[" * 10_000 + "]" * 10_000
    with pytest.raises(ExtendError, match="nested too deeply: more than 64 levels"):
        apply_result(imageprepulljob.JOB_TYPE, ImagePrePullNodeTaskStatus(node_name="e"), _ok("Pull", deep), now=NOW)


JOB_TYPES: list[tuple[JobType, type]] = [
    (nodeupgradejob.JOB_TYPE, NodeUpgradeJobNodeTaskStatus),
    (imageprepulljob.JOB_TYPE, ImagePrePullNodeTaskStatus),
    (configupdatejob.JOB_TYPE, ConfigUpdateJobNodeTaskStatus),
]


@given(st.sampled_from(JOB_TYPES), st.data())
def test_any_report_sequence_keeps_one_entry_per_action_and_never_unsettles(
    pair: tuple[JobType, type], data: st.DataObject
) -> None:
    """Whatever reports arrive, in any order and repeated, each action appears once and a settled node stays."""
    jt, entry_type = pair
    entry = entry_type(node_name="e", phase=NodeTaskPhase.IN_PROGRESS)
    reports = data.draw(st.lists(st.tuples(st.sampled_from(jt.flow.actions), st.booleans()), max_size=12))
    settled: NodeTaskPhase | None = None
    for action, ok in reports:
        extend = "a,b" if jt is nodeupgradejob.JOB_TYPE else ("[]" if jt is imageprepulljob.JOB_TYPE else "")
        out = apply_result(jt, entry, ActionResult(action=action, succ=ok, extend=extend), now=NOW)
        if out is None:
            assert any(a.action == action for a in entry.action_flow)
            continue
        entry = out
        actions = [a.action for a in entry.action_flow]
        assert len(actions) == len(set(actions))
        if settled is not None:
            assert entry.phase is settled
        elif entry.phase in (NodeTaskPhase.SUCCESSFUL, NodeTaskPhase.FAILURE):
            settled = entry.phase
