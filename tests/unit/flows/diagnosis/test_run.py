"""A Diagnosis run, decided purely: paths in order, shared stages once, silent Tasks Unknown, each Task counted once."""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.diagnosis.counted import CountedNodes
from flows.diagnosis.pipeline import HASH_LABEL, pipeline_of
from flows.diagnosis.run import OPERATION_SET_GRACE, advance, awaiting_operation_set, start
from flows.diagnosis.step import FINAL_PHASES, World
from flows.diagnosis.targets import Resolution, resolve
from flows.diagnosis.tasks import request_data
from nodetask.clock import parse_time
from schemas.diagnosis.graph import enumerate_paths, problems
from schemas.diagnosis.v1 import MAX_PARAMETERS_BYTES, DiagnosisPhase, PodReference, StagePolicy, Targets, TaskPhase
from tests.unit.flows.diagnosis.world import T0, TIMEOUT, Outcome, Run, diagnosis, operation_set, operations
from tests.unit.schemas.diagnosis.strategies import dags

pytestmark = pytest.mark.slow(90)

NODES = ("n0", "n1", "n2")


@st.composite
def runs(draw: st.DrawFn) -> Run:
    """A valid graph, one to three target nodes, what each Task does, and a stage policy."""
    successors = draw(dags().filter(lambda s: not problems(operation_set(s).spec.adjacency_list)))
    nodes = NODES[: draw(st.integers(min_value=1, max_value=len(NODES)))]
    table = {(g, n): draw(st.sampled_from(Outcome)) for g in range(1, len(successors)) for n in nodes}
    policy = draw(st.sampled_from(StagePolicy))
    return Run(
        successors=successors,
        outcome=lambda g, n: table[(g, n)],
        diagnosis=diagnosis(nodes, policy=policy),
        opset=operation_set(successors),
        ops=operations(len(successors)),
    )


def expected_path(run: Run) -> tuple[tuple[tuple[int, ...], ...], int | None]:
    """The paths (node ids after the start) and the first whose every stage passes under the policy."""
    paths = tuple(p[1:] for p in enumerate_paths(run.successors))
    nodes = run.diagnosis.spec.target_selector.targets().node_names  # type: ignore[union-attr]
    verdict = all if run.diagnosis.spec.stage_policy is StagePolicy.ALL else any
    for j, path in enumerate(paths):
        if all(verdict(run.outcome(g, n) is Outcome.OK for n in nodes) for g in path):
            return paths, j
    return paths, None


def ids(path: tuple[msgspec.Struct, ...]) -> tuple[int, ...]:
    return tuple(node.id for node in path)  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(runs())
def test_a_run_ends_on_the_first_path_whose_every_stage_passes(run: Run) -> None:
    """Succeeded on the first path all of whose stages pass (All or Any of the nodes), the paths before it
    failed; no Task is ever created twice, whatever the nodes answer or leave unanswered."""
    run.begin()
    run.to_end()
    paths, winner = expected_path(run)
    status = run.diagnosis.status
    if winner is None:
        assert status.phase is DiagnosisPhase.FAILED
        assert [ids(p) for p in status.failed_paths] == list(paths)
        assert status.succeeded_path == ()
    else:
        assert status.phase is DiagnosisPhase.SUCCEEDED
        assert ids(status.succeeded_path) == paths[winner]
        assert [ids(p) for p in status.failed_paths] == list(paths[:winner])


@settings(max_examples=200, deadline=None)
@given(runs())
def test_each_stage_runs_once_per_node_and_passes_on_what_it_learnt(run: Run) -> None:
    """A stage shared by several paths has one Task per node; each Task gets the results its node's
    earlier stages on its path produced, namespaced by operation, and the telemetry keys."""
    run.begin()
    run.to_end()
    paths = enumerate_paths(run.successors)
    stages = [(t.spec.node_name, t.metadata.name.split(".")[3:5]) for t in run.created]
    assert len(stages) == len(set(map(str, stages)))
    for task in run.created:
        _, _, node, j, k, operation = task.metadata.name.split(".")
        before = paths[int(j)][1 : int(k) + 1]
        expected = {f"op-{g}.v": f"{g}@{node}" for g in before if run.outcome(g, node) is Outcome.OK}
        passed = {key: value for key, value in task.spec.parameters.items() if key.startswith("op-")}
        assert passed == expected
        assert operation == f"op-{paths[int(j)][int(k) + 1]}"
        assert task.spec.parameters["task.name"] == task.metadata.name
        assert task.spec.parameters["node"] == node == task.spec.node_name
        assert task.spec.parameters["task.namespace"] == "ns"


@settings(max_examples=200, deadline=None)
@given(runs(), st.lists(st.tuples(st.booleans(), st.booleans()), max_size=40))
def test_crashes_anywhere_change_nothing(run: Run, crashes: list[tuple[bool, bool]]) -> None:
    """Losing a status write, or the creations after one (a controller dying, a new leader), ends the run
    the same way, with the same Tasks, none created twice and every count right."""
    twin = Run(run.successors, run.outcome, run.diagnosis, run.opset, run.ops)
    run.begin()
    run.to_end(crashes)
    twin.begin()
    twin.to_end()
    assert run.diagnosis.status.phase is twin.diagnosis.status.phase
    assert run.diagnosis.status.failed_paths == twin.diagnosis.status.failed_paths
    assert run.diagnosis.status.succeeded_path == twin.diagnosis.status.succeeded_path
    assert sorted(t.metadata.name for t in run.created) == sorted(t.metadata.name for t in twin.created)
    assert run.diagnosis.status.context == twin.diagnosis.status.context


@settings(max_examples=200, deadline=None)
@given(runs())
def test_counts_add_up_and_deciding_again_changes_nothing(run: Run) -> None:
    """After every step, active + succeeded + failed = desired with each counted Task once, and deciding
    again on the written status, seeing the same Tasks, writes the same, creates the same, tells nothing."""
    run.begin()
    for _ in range(1000):
        if run.diagnosis.status.phase in FINAL_PHASES:
            break
        world = run.world()
        first = advance(run.diagnosis, world)
        if not first.expire:
            again = advance(msgspec.structs.replace(run.diagnosis, status=first.status), world)
            assert (again.status, again.create, again.notices) == (first.status, first.create, ())
        before = run.diagnosis.status
        step = run.turn()
        cp = step.status.checkpoint
        assert cp is not None
        assert cp.active + cp.succeeded + cp.failed == cp.desired == len(step.status.node_names)
        assert cp.synchronized_tasks is msgspec.UNSET
        assert len(CountedNodes.decode(cp.synchronized_nodes, cp.desired)) == cp.succeeded + cp.failed
        if not step.create and step.status == before and step.due is not None:
            run.now = step.due
    assert run.diagnosis.status.phase in FINAL_PHASES


# ---------------------------------------------------------------------------------------------- examples

FORK = [[1], [2, 3], [], []]
"""start -> op-1 -> op-2 | op-3: paths (1, 2) and (1, 3), sharing op-1."""


def fork_run(outcome: dict[tuple[int, str], Outcome], nodes: tuple[str, ...] = ("a", "b")) -> Run:
    return Run(
        successors=FORK,
        outcome=lambda g, n: outcome.get((g, n), Outcome.OK),
        diagnosis=diagnosis(nodes, parameters={"p": "1"}),
        opset=operation_set(FORK),
        ops=operations(len(FORK)),
    )


def test_a_failed_path_falls_back_to_the_next_without_running_the_shared_stage_again() -> None:
    """op-2 fails on node b: path 0 fails, path 1 runs op-3 on both nodes and succeeds; op-1 ran once."""
    run = fork_run({(2, "b"): Outcome.FAIL})
    run.begin()
    run.to_end()
    status = run.diagnosis.status
    assert status.phase is DiagnosisPhase.SUCCEEDED
    assert [ids(p) for p in status.failed_paths] == [(1, 2)]
    assert ids(status.succeeded_path) == (1, 3)
    assert sorted(t.metadata.name.split(".", 2)[2] for t in run.created) == [
        "a.0.0.op-1",
        "a.0.1.op-2",
        "a.1.1.op-3",
        "b.0.0.op-1",
        "b.0.1.op-2",
        "b.1.1.op-3",
    ]
    third = next(t for t in run.created if t.spec.operation == "op-3" and t.spec.node_name == "a")
    # The Diagnosis's parameters stay in the Diagnosis: the hub adds them when it sends the Task.
    assert third.spec.parameters == {
        "op-1.v": "1@a",
        "task.name": third.metadata.name,
        "task.namespace": "ns",
        "node": "a",
    }
    assert request_data(run.diagnosis.spec.parameters, third.spec.parameters) == {"p": "1", **third.spec.parameters}
    assert status.context is not None
    assert status.context.parameters == {"p": "1"}
    assert status.context.operations["op-3"] == {f"d.0123abcd.{n}.1.1.op-3": {"v": f"3@{n}"} for n in ("a", "b")}
    reasons = [n.reason for step in run.steps for n in step.notices]
    assert reasons == [
        "DiagnosisRunning",
        "StagePassed",
        "OperationFailed",
        "StagePassed",
        "DiagnosisSucceeded",
    ]


def test_a_silent_task_becomes_unknown_after_its_timeout_and_fails_the_stage() -> None:
    """Node b never answers op-3: at the operation's timeout from creation its Task is Unknown, the stage
    fails, and with every path failed the Diagnosis fails; nothing waits forever."""
    run = fork_run({(2, "b"): Outcome.FAIL, (3, "b"): Outcome.SILENT})
    run.begin()
    run.to_end()
    silent = run.tasks["d.0123abcd.b.1.1.op-3"]
    assert silent.status.phase is TaskPhase.UNKNOWN
    assert [(c.type, c.reason) for c in silent.status.conditions] == [("Failed", "TimedOut")]
    assert run.now == _created_at(run, "d.0123abcd.b.1.1.op-3") + timedelta(seconds=TIMEOUT)
    status = run.diagnosis.status
    assert status.phase is DiagnosisPhase.FAILED
    assert [ids(p) for p in status.failed_paths] == [(1, 2), (1, 3)]
    assert [(c.type, c.status, c.reason) for c in status.conditions][-1] == ("Complete", "False", "AllPathsFailed")


def test_a_task_dispatched_late_gets_its_whole_timeout_from_dispatch() -> None:
    """The deadline counts from the hub's startTime when there is one, else from the Task's creation."""
    run = fork_run({(1, "a"): Outcome.SILENT}, nodes=("a",))
    run.begin()
    step = run.turn()
    (task,) = step.create
    assert step.due == run.now + timedelta(seconds=TIMEOUT)
    name = task.metadata.name
    run.now += timedelta(seconds=TIMEOUT - 1)
    dispatched = msgspec.structs.replace(
        run.tasks[name].status, phase=TaskPhase.RUNNING, start_time="2026-01-01T00:00:09Z"
    )
    run.tasks[name] = msgspec.structs.replace(run.tasks[name], status=dispatched)
    run.now += timedelta(seconds=2)
    step = advance(run.diagnosis, run.world())
    assert step.expire == ()
    assert step.due == run.now - timedelta(seconds=2) + timedelta(seconds=TIMEOUT)


def test_a_changed_operation_set_fails_the_run() -> None:
    """Another graph under the same OperationSet name fails a running Diagnosis with OperationSetChanged."""
    run = fork_run({})
    run.begin()
    run.turn()
    run.opset = operation_set([[1], [2], []])
    step = advance(run.diagnosis, run.world())
    assert step.status.phase is DiagnosisPhase.FAILED
    assert step.create == ()
    changed = [c for c in step.status.conditions if c.type == "OperationSetChanged"]
    assert changed[0].status == "True"
    assert "has been changed during diagnosis execution" in changed[0].message
    assert [n.reason for n in step.notices] == ["DiagnosisFailed"]


def test_ids_filled_in_by_defaulting_are_not_a_change() -> None:
    """The hash covers operations and successors only: the webhook adding ids leaves it as it was."""
    defaulted = operation_set(FORK)
    nodes = tuple(msgspec.structs.replace(n, id=i) for i, n in enumerate(defaulted.spec.adjacency_list))
    numbered = msgspec.structs.replace(defaulted, spec=msgspec.structs.replace(defaulted.spec, adjacency_list=nodes))
    assert pipeline_of(numbered).hash == pipeline_of(defaulted).hash


def test_a_missing_or_broken_operation_set_fails_before_any_task() -> None:
    """No OperationSet: OperationSetNotFound; a graph that cannot run: OperationSetNotReady naming the node."""
    d = diagnosis(("a",))
    world = World(pipeline=None, operations=operations(2), tasks={}, now=run_now())
    step = start(d, world, Resolution(("a",)))
    assert step.status.phase is DiagnosisPhase.FAILED
    assert {c.type for c in step.status.conditions} == {"OperationSetNotFound", "Complete"}
    broken = pipeline_of(operation_set([[1], [], []]))
    step = start(d, World(pipeline=broken, operations=operations(3), tasks={}, now=run_now()), Resolution(("a",)))
    [ready] = [c for c in step.status.conditions if c.type == "OperationSetNotReady"]
    assert "spec.adjacencyList[2]: node 2 (op-2) is not reachable from the start node 0" in ready.message


@given(st.floats(min_value=0, max_value=120))
def test_a_new_diagnosis_waits_for_a_missing_operation_set_only_during_the_grace(seconds: float) -> None:
    """Missing: wait until creation + grace, then decide (fail); an existing or broken set is decided at once."""
    d = diagnosis(("a",))
    now = T0 + timedelta(seconds=seconds)
    missing = World(pipeline=None, operations=operations(2), tasks={}, now=now)
    expected = T0 + OPERATION_SET_GRACE if now < T0 + OPERATION_SET_GRACE else None
    assert awaiting_operation_set(d, missing) == expected
    for pipeline in (pipeline_of(operation_set(FORK)), pipeline_of(operation_set([[1], [], []]))):
        assert awaiting_operation_set(d, World(pipeline=pipeline, operations=operations(4), tasks={}, now=now)) is None


def test_no_target_fails_with_the_reason_instead_of_running_forever() -> None:
    """A selector that selects nothing fails the Diagnosis with NoTargets and what matched nothing."""
    d = diagnosis(("a",))
    world = World(pipeline=pipeline_of(operation_set(FORK)), operations=operations(4), tasks={}, now=run_now())
    step = start(d, world, Resolution((), empty_reason="the node selector 'zone=x' matched no node"))
    assert step.status.phase is DiagnosisPhase.FAILED
    accepted = next(c for c in step.status.conditions if c.type == "Accepted")
    assert (accepted.status, accepted.reason) == ("False", "NoTargets")
    assert accepted.message == "the node selector 'zone=x' matched no node"
    assert step.labels == {}


def test_too_many_targets_or_too_large_parameters_fail_before_any_task() -> None:
    """A Diagnosis stored while the webhook was away: more targets than allowed fails with TooManyTargets, and
    parameters over 64 KiB with ParametersTooLarge, each saying why in Accepted and Complete; no Task, no label."""
    world = World(pipeline=pipeline_of(operation_set(FORK)), operations=operations(4), tasks={}, now=run_now())
    too_many = resolve(Targets(node_names=("a", "b", "c")), namespace="ns", max_targets=2)
    step = start(diagnosis(("a", "b", "c")), world, too_many)
    assert step.status.phase is DiagnosisPhase.FAILED
    reasons = {c.type: (c.status, c.reason, c.message) for c in step.status.conditions}
    said = "it lists 3 node names, more than the 2 a Diagnosis may have (the controller's diagnosisMaxTargets)"
    assert reasons["Accepted"] == ("False", "TooManyTargets", said)
    assert reasons["Complete"] == ("False", "TooManyTargets", said)
    assert (step.create, step.labels) == ((), {})
    large = diagnosis(("a",), parameters={"k": "x" * MAX_PARAMETERS_BYTES})
    step = start(large, world, Resolution(("a",)))
    [accepted] = [c for c in step.status.conditions if c.type == "Accepted"]
    assert (step.status.phase, accepted.reason) == (DiagnosisPhase.FAILED, "ParametersTooLarge")
    assert accepted.message == (
        f"spec.parameters take {MAX_PARAMETERS_BYTES + 8} bytes as JSON, more than the {MAX_PARAMETERS_BYTES} a"
        " Diagnosis's may"
    )
    assert (step.create, step.labels) == ((), {})


def test_a_stage_whose_operation_is_missing_fails_without_tasks() -> None:
    """op-2 does not exist: its stage fails at once (no Task), and the run goes on with path 1."""
    run = fork_run({})
    del run.ops["op-2"]
    run.begin()
    run.to_end()
    assert run.diagnosis.status.phase is DiagnosisPhase.SUCCEEDED
    assert not [t for t in run.created if t.spec.operation == "op-2"]
    assert "OperationNotFound" in [n.reason for step in run.steps for n in step.notices]


def test_stage_policy_any_passes_a_stage_one_node_passed() -> None:
    """With stagePolicy Any, op-2 failing on one of two nodes still passes; with All it fails the path."""
    for policy, winner in ((StagePolicy.ANY, (1, 2)), (StagePolicy.ALL, (1, 3))):
        run = fork_run({(2, "b"): Outcome.FAIL})
        run.diagnosis = msgspec.structs.replace(
            run.diagnosis, spec=msgspec.structs.replace(run.diagnosis.spec, stage_policy=policy)
        )
        run.begin()
        run.to_end()
        assert ids(run.diagnosis.status.succeeded_path) == winner


def test_a_finished_diagnosis_is_deleted_after_its_ttl() -> None:
    """ttlSecondsAfterFinished counts from the Complete condition; until then the step says when."""
    run = fork_run({})
    run.diagnosis = msgspec.structs.replace(
        run.diagnosis, spec=msgspec.structs.replace(run.diagnosis.spec, ttl_seconds_after_finished=60)
    )
    run.begin()
    run.to_end()
    finished = run.now
    step = advance(run.diagnosis, run.world())
    assert (step.delete, step.due) == (False, finished + timedelta(seconds=60))
    run.now = finished + timedelta(seconds=60)
    assert advance(run.diagnosis, run.world()).delete


def test_start_stamps_the_graph_hash_and_the_pods() -> None:
    """Starting records the graph's hash as a label and, for pod targets, the pod of each node."""
    run = fork_run({})
    pods = {"a": PodReference(namespace="ns", name="web-0", container="c")}
    step = start(run.diagnosis, run.world(), Resolution(("a",), pods))
    assert step.labels == {HASH_LABEL: pipeline_of(run.opset).hash}
    assert msgspec.json.decode(step.annotations["diagnosis.kubediag.org/target-pods"]) == {
        "a": {"namespace": "ns", "name": "web-0", "container": "c"}
    }
    meta = msgspec.structs.replace(run.diagnosis.metadata, labels=dict(step.labels), annotations=dict(step.annotations))
    run.diagnosis = msgspec.structs.replace(run.diagnosis, metadata=meta, status=step.status)
    (task,) = advance(run.diagnosis, run.world()).create
    assert task.spec.pod_reference == pods["a"]
    assert (task.spec.parameters["pod.name"], task.spec.parameters["container"]) == ("web-0", "c")


def run_now() -> datetime:
    return T0


def _created_at(run: Run, name: str) -> datetime:
    return parse_time(run.tasks[name].metadata.creation_timestamp)
