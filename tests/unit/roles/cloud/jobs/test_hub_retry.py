"""A hub dispatching a retried job: each node task names its attempt, and reports of another attempt change nothing."""

from __future__ import annotations

from typing import Any

import msgspec
import trio.testing

from flows.nodejobs import imageprepulljob
from flows.nodejobs.changes import RecordOutcome, record, refuse
from flows.nodejobs.imageprepulljob import CHECK, PULL
from nodetask.messages import (
    ATTEMPTS_CAPABILITY,
    KUBELET_CAPABILITY,
    ActionResult,
    Cancel,
    Report,
    ReportAck,
    RunAction,
)
from nodetask.phases import JobPhase, NodeTaskPhase
from nodetask.route import Route
from roles.kube.resources import job_resource
from schemas.kinds import NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from schemas.v1alpha2 import (
    API_VERSION,
    ImagePrePullJob,
    NodeComponent,
    NodeUpgradeJob,
    NodeUpgradeJobNodeTaskStatus,
    NodeUpgradeJobSpec,
    NodeUpgradeJobStatus,
    PreviousAttempt,
    RetryStatus,
)
from tests.unit.roles.cloud.doubles import PREPULLS, MemoryApi, edge_nodes, prepull_job, running_hub

PENDING = NodeTaskPhase.PENDING
UPGRADES = job_resource(NODE_UPGRADE_JOB)
NOW = "2026-11-26T00:00:00Z"
ROUTE_JUMP = Route(API_VERSION, "imageprepulljob", "jump", "n0")


def retried_job(name: str, *nodes: str, attempt: int = 2) -> ImagePrePullJob:
    """A pre-pull job just retried: every node Pending at ``attempt``, its previous attempt failed."""
    job = prepull_job(name, f"uid-{name}", [(n, PENDING) for n in nodes])
    previous = PreviousAttempt(attempt=attempt - 1, phase=NodeTaskPhase.FAILURE, action=PULL, reason="not found")
    entries = tuple(
        msgspec.structs.replace(e, attempt=attempt, previous_attempt=previous) for e in job.status.node_status
    )
    status = msgspec.structs.replace(
        job.status, node_status=entries, retry=RetryStatus(handled="1", attempt=attempt, time=NOW, nodes=len(nodes))
    )
    return msgspec.structs.replace(job, status=status)


def _report(run: RunAction, seq: int, action: str, *, attempt: int, succ: bool = True) -> Report:
    return Report(
        route=run.route,
        job_uid=run.job_uid,
        seq=seq,
        action=action,
        succ=succ,
        reason="" if succ else "x",
        attempt=attempt,
    )


def _entry(api: MemoryApi, job: str, node: str) -> Any:
    return next(e for e in api.peek(PREPULLS, job).status.node_status if e.node_name == node)


async def test_a_retried_node_runs_its_attempt_and_a_late_report_of_the_first_attempt_changes_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The RunAction names attempt 2; attempt 1's late Pull failure is acknowledged and ignored; attempt 2's applies."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    api.put(PREPULLS, retried_job("again", "n0"))
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello(capabilities=(ATTEMPTS_CAPABILITY,))
        run = await edge.next_of(RunAction)
        assert (run.attempt, run.action, run.id) == (2, CHECK, "uid-again/n0/2.1")

        writes = api.status_writes
        await edge.send(_report(run, 7, PULL, attempt=1, succ=False))
        assert await edge.next_of(ReportAck) == ReportAck(job_uid=run.job_uid, seq=7)
        assert api.status_writes == writes
        entry = _entry(api, "again", "n0")
        assert (entry.phase, entry.action_flow, entry.attempt) == (NodeTaskPhase.IN_PROGRESS, (), 2)

        for seq, action in ((8, CHECK), (9, PULL)):
            await edge.send(_report(run, seq, action, attempt=2))
            assert await edge.next_of(ReportAck) == ReportAck(job_uid=run.job_uid, seq=seq)
    entry = _entry(api, "again", "n0")
    assert (entry.phase, [a.action for a in entry.action_flow]) == (NodeTaskPhase.SUCCESSFUL, [CHECK, PULL])
    assert entry.previous_attempt.reason == "not found"


async def test_a_retried_node_whose_agent_knows_no_attempts_fails_with_the_reason_instead_of_running(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An agent without the 'attempts' capability would take a retry for a re-delivery: its node fails instead."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    api.put(PREPULLS, retried_job("old-agent", "n0"))
    async with running_hub(api) as (_, door):
        edge = door.connect("n0")
        await edge.hello(version="v0.9")
        assert [f for f in await edge.frames_within(10) if isinstance(f, RunAction)] == []
    entry = _entry(api, "old-agent", "n0")
    assert entry.phase is NodeTaskPhase.FAILURE
    assert "(version v0.9) cannot run a retry" in entry.reason
    assert "'attempts'" in entry.reason


async def test_a_job_retried_while_this_hub_missed_its_end_is_dispatched_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A hub whose watch jumps from the first run to the retried one cancels attempt 1 and dispatches attempt 2."""
    api = MemoryApi()
    edge_nodes(api, "n0")
    first = prepull_job("jump", "uid-jump", [("n0", NodeTaskPhase.IN_PROGRESS)])
    api.put(PREPULLS, first)
    async with running_hub(api) as (hub, door):
        edge = door.connect("n0")
        await edge.hello(capabilities=(ATTEMPTS_CAPABILITY,))
        assert (await edge.next_of(RunAction)).attempt == 1
        api.put(PREPULLS, retried_job("jump", "n0"))
        assert await edge.next_of(Cancel) == Cancel(route=ROUTE_JUMP, job_uid="uid-jump", attempt=1)
        again = await edge.next_of(RunAction)
        assert again.attempt == 2
        assert [r.run_number for r in hub.runners()] == [1, 2]


def _job_with(attempt: int) -> Any:
    return retried_job("pure", "n0", attempt=attempt)


def test_a_report_names_the_attempt_it_belongs_to_or_none() -> None:
    """Attempt 0 (an agent that knows none) is the current one; another attempt is acknowledged with no change."""
    job = msgspec.structs.replace(
        _job_with(3), status=msgspec.structs.replace(_job_with(3).status, phase=JobPhase.IN_PROGRESS)
    )
    check = ActionResult(action=CHECK, succ=True)
    jt = imageprepulljob.JOB_TYPE
    for attempt in (0, 3):
        new, outcome = record(jt, "n0", check, uid="uid-pure", now=NOW, attempt=attempt)(job)
        assert outcome == RecordOutcome(applied=True)
        assert new is not None
        assert [a.action for a in new.status.node_status[0].action_flow] == [CHECK]
    for attempt in (1, 2, 4):
        new, outcome = record(jt, "n0", check, uid="uid-pure", now=NOW, attempt=attempt)(job)
        assert (new, outcome) == (None, RecordOutcome(applied=False, other_attempt=3))
        assert outcome.acknowledge


def test_a_refusal_fails_only_the_pending_attempt_it_names() -> None:
    """refuse() turns that Pending attempt into Failure with the reason; any other state is left alone."""
    job = _job_with(2)
    new, refused = refuse("n0", uid="uid-pure", attempt=2, reason="too old")(job)
    assert refused
    assert new is not None
    assert (new.status.node_status[0].phase, new.status.node_status[0].reason) == (NodeTaskPhase.FAILURE, "too old")
    assert refuse("n0", uid="uid-pure", attempt=3, reason="x")(job) == (None, False)
    assert refuse("n0", uid="other", attempt=2, reason="x")(job) == (None, False)
    assert refuse("n0", uid="uid-pure", attempt=2, reason="x")(new) == (None, False)


def _kubelet_upgrade(name: str, node: str) -> NodeUpgradeJob:
    return NodeUpgradeJob(
        metadata=ObjectMeta(name=name, uid=f"uid-{name}"),
        spec=NodeUpgradeJobSpec(version="v1.20.3", node_names=(node,), component=NodeComponent.KUBELET),
        status=NodeUpgradeJobStatus(
            phase=JobPhase.IN_PROGRESS,
            node_status=(NodeUpgradeJobNodeTaskStatus(node_name=node, phase=PENDING),),
        ),
    )


async def test_a_kubelet_job_goes_only_to_an_agent_that_acts_on_the_kubelet(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An agent without 'kubelet.v1' would take the job for an upgrade of itself: its node fails naming why;
    an agent announcing it gets the RunAction."""
    api = MemoryApi()
    edge_nodes(api, "old", "new")
    api.put(UPGRADES, _kubelet_upgrade("k-old", "old"))
    api.put(UPGRADES, _kubelet_upgrade("k-new", "new"))
    async with running_hub(api) as (_, door):
        old = door.connect("old")
        await old.hello(version="v0.9", capabilities=(ATTEMPTS_CAPABILITY,))
        assert [f for f in await old.frames_within(10) if isinstance(f, RunAction)] == []
        new = door.connect("new")
        await new.hello(capabilities=(ATTEMPTS_CAPABILITY, KUBELET_CAPABILITY))
        run = await new.next_of(RunAction)
        assert (run.job_uid, run.action) == ("uid-k-new", "Check")
    (entry,) = api.peek(UPGRADES, "k-old").status.node_status
    assert entry.phase is NodeTaskPhase.FAILURE
    assert entry.reason.startswith("the agent on this node (version v0.9) cannot act on the kubelet:"), entry.reason
    assert "'kubelet.v1'" in entry.reason
