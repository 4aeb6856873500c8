"""The controller's pure decisions: node selection, initial status, timeouts, phase and events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import msgspec
import pytest

from flows.nodejobs import decide
from nodetask.phases import ConditionStatus, JobPhase, NodeTaskPhase
from schemas import v1alpha2
from schemas.access import counted
from schemas.core import AGENT_VERSION_ANNOTATION, EDGE_ROLE_LABEL, Node, NodeCondition, NodeStatus, NodeSystemInfo
from schemas.kinds import CONFIG_UPDATE_JOB, IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta

CREATED = "2026-11-25T10:00:00Z"
T0 = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)


def node(name: str, *, edge: bool = True, ready: bool = True, version: str = "", **labels: str) -> Node:
    meta_labels = {**labels, **({EDGE_ROLE_LABEL: ""} if edge else {})}
    annotations = {AGENT_VERSION_ANNOTATION: version} if version else {}
    return Node(
        metadata=ObjectMeta(name=name, labels=meta_labels, annotations=annotations),
        status=NodeStatus(conditions=(NodeCondition(type="Ready", status="True" if ready else "False"),)),
    )


def upgrade_job(**spec: object) -> v1alpha2.NodeUpgradeJob:
    return v1alpha2.NodeUpgradeJob(
        metadata=ObjectMeta(name="up", uid="u1", creation_timestamp=CREATED),
        spec=msgspec.convert({"version": "v1.21.0", **spec}, v1alpha2.NodeUpgradeJobSpec),
    )


NODES = {n.metadata.name: n for n in (node("e1"), node("e2"), node("cloud", edge=False), node("down", ready=False))}


def test_both_or_neither_selector_fails_with_kubeedges_texts() -> None:
    """Exactly one of nodeNames and labelSelector: otherwise the job fails with KubeEdge's reason."""
    both = upgrade_job(nodeNames=["e1"], labelSelector={"matchLabels": {"a": "b"}})
    with pytest.raises(decide.SelectionError, match=decide.BOTH_SELECTORS):
        decide.select_nodes(both, NODES)
    status = decide.initial_status(NODE_UPGRADE_JOB, upgrade_job(), NODES)
    assert (status.phase, status.reason, status.node_status) == (JobPhase.FAILURE, decide.NO_SELECTOR, ())


def test_selection_failure_keeps_its_reason() -> None:
    """A job that failed at selection is left alone: its reason is not replaced by the phase maths."""
    failed = msgspec.structs.replace(
        upgrade_job(), status=decide.initial_status(NODE_UPGRADE_JOB, upgrade_job(), NODES)
    )
    assert decide.next_status(NODE_UPGRADE_JOB, failed, now=T0, connected=always) is None


def test_selector_matching_nothing_fails() -> None:
    """A selector with no match fails the job with 'no nodes were matched with selector'."""
    job = upgrade_job(labelSelector={"matchLabels": {"zone": "mars"}})
    assert decide.initial_status(NODE_UPGRADE_JOB, job, NODES).reason == decide.NO_MATCH


def test_names_keep_order_deduplicate_and_explain_failures() -> None:
    """By names: spec order kept, duplicates dropped, missing/non-edge/not-ready nodes fail with reasons."""
    job = upgrade_job(nodeNames=["e2", "ghost", "e1", "cloud", "e2", "down"])
    status = decide.initial_status(NODE_UPGRADE_JOB, job, NODES)
    assert status.phase is JobPhase.INIT
    assert [(e.node_name, e.phase, e.reason) for e in status.node_status] == [
        ("e2", NodeTaskPhase.PENDING, ""),
        ("ghost", NodeTaskPhase.FAILURE, 'failed to get node, err: nodes "ghost" not found'),
        ("e1", NodeTaskPhase.PENDING, ""),
        ("cloud", NodeTaskPhase.FAILURE, "the node is not an edge node"),
        ("down", NodeTaskPhase.FAILURE, "the node is not ready"),
    ]
    assert status.node_counts == v1alpha2.NodeCounts(total=5, pending=2, failure=3)


def test_selector_selects_in_name_order_with_the_same_checks() -> None:
    """By selector: matching nodes in name order, with the edge and Ready checks."""
    nodes = {**NODES, "z": node("z", zone="a"), "a": node("a", zone="a"), "n": node("n", ready=False, zone="a")}
    job = upgrade_job(labelSelector={"matchLabels": {"zone": "a"}})
    entries = decide.initial_status(NODE_UPGRADE_JOB, job, nodes).node_status
    assert [(e.node_name, e.phase) for e in entries] == [
        ("a", NodeTaskPhase.PENDING),
        ("n", NodeTaskPhase.FAILURE),
        ("z", NodeTaskPhase.PENDING),
    ]


def test_node_already_at_target_version_is_successful() -> None:
    """An upgrade skips a node whose agent already runs the target version, recording why."""
    nodes = {"new": node("new", version="v1.21.0"), "old": node("old", version="v1.20.0")}
    entries = decide.initial_status(NODE_UPGRADE_JOB, upgrade_job(nodeNames=["new", "old"]), nodes).node_status
    assert [(e.phase, e.reason) for e in entries] == [
        (NodeTaskPhase.SUCCESSFUL, "the node already runs version v1.21.0"),
        (NodeTaskPhase.PENDING, ""),
    ]


def test_a_kubelet_upgrade_skips_a_node_by_its_kubelet_version_not_its_agents() -> None:
    """With ``component: kubelet`` the Node's ``kubeletVersion`` decides, whatever the agent's annotation says."""
    at = msgspec.structs.replace(
        node("at", version="v1.20.0"),
        status=NodeStatus(
            conditions=(NodeCondition(type="Ready", status="True"),),
            node_info=NodeSystemInfo(kubelet_version="v1.21.0"),
        ),
    )
    nodes = {"at": at, "agent-only": node("agent-only", version="v1.21.0")}
    job = upgrade_job(nodeNames=["at", "agent-only"], component="kubelet")
    entries = decide.initial_status(NODE_UPGRADE_JOB, job, nodes).node_status
    assert [(e.phase, e.reason) for e in entries] == [
        (NodeTaskPhase.SUCCESSFUL, "the node's kubelet already runs version v1.21.0"),
        (NodeTaskPhase.PENDING, ""),
    ]


def test_final_phases_per_kind() -> None:
    """NodeUpgradeJob is final only when Completed; the other kinds also at Failure."""
    assert decide.is_final(NODE_UPGRADE_JOB, JobPhase.COMPLETED)
    assert not decide.is_final(NODE_UPGRADE_JOB, JobPhase.FAILURE)
    for kind in (IMAGE_PRE_PULL_JOB, CONFIG_UPDATE_JOB):
        assert decide.is_final(kind, JobPhase.FAILURE)
        assert decide.is_final(kind, JobPhase.COMPLETED)
        assert not decide.is_final(kind, JobPhase.IN_PROGRESS)


def _running(entries: list[v1alpha2.NodeUpgradeJobNodeTaskStatus], timeout: int = 10) -> v1alpha2.NodeUpgradeJob:
    job = upgrade_job(nodeNames=[e.node_name for e in entries], timeoutSeconds=timeout)
    return msgspec.structs.replace(
        job, status=v1alpha2.NodeUpgradeJobStatus(phase=JobPhase.IN_PROGRESS, node_status=tuple(entries))
    )


def _entry(name: str, phase: NodeTaskPhase, dispatched: str = "") -> v1alpha2.NodeUpgradeJobNodeTaskStatus:
    return v1alpha2.NodeUpgradeJobNodeTaskStatus(node_name=name, phase=phase, dispatch_time=dispatched)


def always(_: str) -> bool:
    return True


def never(_: str) -> bool:
    return False


def test_timeout_counts_from_dispatch() -> None:
    """Dispatched 8 s ago with a 10 s timeout: unchanged; 2 s later: Unknown with KubeEdge's reason."""
    job = _running([_entry("e1", NodeTaskPhase.IN_PROGRESS, "2026-11-25T10:05:00Z")])
    assert decide.next_status(NODE_UPGRADE_JOB, job, now=T0 + timedelta(minutes=5, seconds=8), connected=always) == (
        msgspec.structs.replace(job.status, node_counts=v1alpha2.NodeCounts(total=1, in_progress=1))
    )
    later = decide.next_status(NODE_UPGRADE_JOB, job, now=T0 + timedelta(minutes=5, seconds=10), connected=always)
    assert later is not None
    assert (later.node_status[0].phase, later.node_status[0].reason) == (NodeTaskPhase.UNKNOWN, decide.TIMED_OUT)
    assert later.phase is JobPhase.FAILURE


def test_queued_node_on_a_connected_agent_never_times_out() -> None:
    """A Pending node whose agent is connected waits for its turn however long it takes."""
    job = _running([_entry("e1", NodeTaskPhase.PENDING)])
    status = decide.next_status(NODE_UPGRADE_JOB, job, now=T0 + timedelta(hours=5), connected=always)
    assert status is not None
    assert status.node_status[0].phase is NodeTaskPhase.PENDING
    assert decide.next_deadline(job, connected=always) is None


def test_pending_node_connected_nowhere_times_out_from_creation() -> None:
    """A Pending node no hub holds becomes Unknown timeoutSeconds after the job was created."""
    job = _running([_entry("e1", NodeTaskPhase.PENDING)])
    assert decide.next_deadline(job, connected=never) == T0 + timedelta(seconds=10)
    status = decide.next_status(NODE_UPGRADE_JOB, job, now=T0 + timedelta(seconds=11), connected=never)
    assert status is not None
    assert (status.node_status[0].phase, status.node_status[0].reason) == (
        NodeTaskPhase.UNKNOWN,
        decide.NOT_CONNECTED,
    )


def test_terminal_nodes_and_unset_timeouts() -> None:
    """Ended nodes are never timed out; no timeoutSeconds means the 300 s default (KubeEdge: none)."""
    job = _running([_entry("ok", NodeTaskPhase.SUCCESSFUL), _entry("bad", NodeTaskPhase.FAILURE)])
    status = decide.next_status(NODE_UPGRADE_JOB, job, now=T0 + timedelta(days=1), connected=never)
    assert status is not None
    assert [e.phase for e in status.node_status] == [NodeTaskPhase.SUCCESSFUL, NodeTaskPhase.FAILURE]
    default = msgspec.structs.replace(
        _running([_entry("e1", NodeTaskPhase.IN_PROGRESS, CREATED)]),
        spec=v1alpha2.NodeUpgradeJobSpec(version="v1", node_names=("e1",)),
    )
    assert decide.next_deadline(default, connected=always) == T0 + timedelta(seconds=300)


def test_dispatch_time_falls_back_to_last_action_then_creation() -> None:
    """Without a dispatch time (a foreign hub), the last action's time, else the creation time, is used."""
    entry = msgspec.structs.replace(
        _entry("e1", NodeTaskPhase.IN_PROGRESS),
        action_flow=(v1alpha2.ActionStatus(action="Check", status=ConditionStatus.TRUE, time="2026-11-25T10:01:00Z"),),
    )
    job = _running([entry])
    assert decide.next_deadline(job, connected=always) == T0 + timedelta(minutes=1, seconds=10)
    bad = msgspec.structs.replace(entry, action_flow=(v1alpha2.ActionStatus(action="Check", time="yesterday"),))
    assert decide.next_deadline(_running([bad]), connected=always) == T0 + timedelta(seconds=10)


def test_phase_and_reason_follow_kubeedges_maths() -> None:
    """With tolerance 0.5, two of three failed nodes fail the job with KubeEdge's reason; the counts follow."""
    job = _running(
        [_entry("a", NodeTaskPhase.UNKNOWN), _entry("b", NodeTaskPhase.SUCCESSFUL), _entry("c", NodeTaskPhase.FAILURE)]
    )
    job = msgspec.structs.replace(job, spec=msgspec.structs.replace(job.spec, failure_tolerate="0.5"))
    status = decide.next_status(NODE_UPGRADE_JOB, job, now=T0, connected=always)
    assert status is not None
    assert status.phase is JobPhase.FAILURE
    assert status.reason == "the number of failed nodes is 2/3, which exceeds the failure tolerance threshold"
    assert status.node_counts == v1alpha2.NodeCounts(total=3, successful=1, failure=1, unknown=1)
    assert (
        decide.next_status(NODE_UPGRADE_JOB, msgspec.structs.replace(job, status=status), now=T0, connected=always)
        is None
    )


def test_notices_tell_phase_changes_and_node_failures() -> None:
    """A status change yields a Warning per newly failed or timed-out node and one per job phase change."""
    old = v1alpha2.NodeUpgradeJobStatus(
        phase=JobPhase.IN_PROGRESS,
        node_status=(_entry("a", NodeTaskPhase.IN_PROGRESS), _entry("b", NodeTaskPhase.IN_PROGRESS)),
    )
    new = v1alpha2.NodeUpgradeJobStatus(
        phase=JobPhase.FAILURE,
        reason="too many",
        node_status=(
            msgspec.structs.replace(_entry("a", NodeTaskPhase.UNKNOWN), reason=decide.TIMED_OUT),
            msgspec.structs.replace(_entry("b", NodeTaskPhase.FAILURE), reason="disk full"),
        ),
    )
    assert decide.notices(old, new) == [
        decide.Notice("Warning", "NodeTaskTimedOut", "node a: The node task has timed out"),
        decide.Notice("Warning", "NodeTaskFailed", "node b: disk full"),
        decide.Notice("Warning", "JobFailure", "job phase InProgress -> Failure: too many"),
    ]
    assert decide.notices(new, new) == []


def test_a_final_jobs_counts_follow_a_late_revival_but_its_phase_stays() -> None:
    """A node revived after the job ended is counted again; the phase of the final job is left alone."""
    running = _running([_entry("a", NodeTaskPhase.SUCCESSFUL), _entry("b", NodeTaskPhase.UNKNOWN)])
    job = msgspec.structs.replace(running, status=msgspec.structs.replace(running.status, phase=JobPhase.COMPLETED))
    first = counted(job)
    assert counted(first) is first
    revived_entries = tuple(
        msgspec.structs.replace(e, phase=NodeTaskPhase.SUCCESSFUL) for e in first.status.node_status
    )
    revived = msgspec.structs.replace(first, status=msgspec.structs.replace(first.status, node_status=revived_entries))
    recounted = counted(revived)
    assert recounted is not revived
    status = recounted.status
    assert status.node_counts is not None
    assert (status.phase, status.node_counts.successful, status.node_counts.unknown) == (JobPhase.COMPLETED, 2, 0)
