"""A Diagnosis's checkpoint counts each Task once in a record that stays small, and reads an older controller's."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flows.diagnosis.counted import CountedNodes, InvalidCountError, counted_nodes
from flows.diagnosis.paths import PathFlow
from flows.diagnosis.pipeline import Pipeline, pipeline_of
from flows.diagnosis.run import advance, start
from flows.diagnosis.step import FINAL_PHASES, World
from flows.diagnosis.targets import Resolution
from flows.diagnosis.tasks import task_name
from schemas.diagnosis.v1 import Checkpoint, Diagnosis, DiagnosisPhase, DiagnosisStatus, Task, TaskPhase
from tests.unit.flows.diagnosis.world import T0, Outcome, Run, diagnosis, operation_set, operations

ETCD_LIMIT = 1536 * 1024
"""etcd's default request limit (--max-request-bytes): a Diagnosis bigger than this cannot be written."""
CHAIN = [[1], [2], []]


def test_a_five_thousand_node_stage_keeps_the_status_under_etcds_limit() -> None:
    """5,000 nodes with long cloud names, one of them silent: while the stage waits for it with 4,999 Tasks
    counted, and until the run ends, every status written stays under 1.5 MiB as JSON (KubeDiag's list of
    the counted Tasks' names took more than that on its own, with the names and the context)."""
    nodes = tuple(f"ip-10-{i // 250}-{i % 250}-{'a' * 40}.eu-central-1.compute.internal" for i in range(5000))
    base = diagnosis(nodes)
    long_name = msgspec.structs.replace(base.metadata, name="node-health-" + "d" * 50)
    run = Run(
        successors=[[1], []],
        outcome=lambda g, n: Outcome.SILENT if n == nodes[-1] else Outcome.OK,
        diagnosis=msgspec.structs.replace(base, metadata=long_name),
        opset=operation_set([[1], []]),
        ops=operations(2),
        results=lambda g, n: {"out": "x" * 200},
    )
    run.begin()
    largest = 0
    while run.diagnosis.status.phase not in FINAL_PHASES:
        step = run.turn()
        largest = max(largest, len(msgspec.json.encode(run.diagnosis.status)))
        if not step.create and step.due is not None:
            run.now = step.due
    status = run.diagnosis.status
    assert status.phase is DiagnosisPhase.FAILED  # the silent node's Task became Unknown: the stage failed
    assert status.checkpoint is not None
    assert (status.checkpoint.succeeded, status.checkpoint.failed) == (4999, 1)
    assert largest < ETCD_LIMIT


# ---------------------------------------------------------------------------------------------- exactly once


@dataclasses.dataclass
class Stage:
    """The API server's copy of a Diagnosis over ``CHAIN`` and of its Tasks, as passes and edges change them."""

    diagnosis: Diagnosis
    outcomes: dict[str, Outcome]
    """What each Task does when it ends, by the target node's name."""
    tasks: dict[str, Task] = dataclasses.field(default_factory=dict)
    ended: dict[str, TaskPhase] = dataclasses.field(default_factory=dict)
    """The phase each ended Task ended in, by Task name."""

    def world(self, stale: frozenset[str] = frozenset()) -> World:
        """What a controller sees: the Tasks, those named in ``stale`` as they were before they ended."""
        tasks = dict(self.tasks)
        for name in stale & tasks.keys():
            tasks[name] = msgspec.structs.replace(
                tasks[name], status=msgspec.structs.replace(tasks[name].status, phase=TaskPhase.NONE)
            )
        return World(pipeline=pipeline_of(operation_set(CHAIN)), operations=operations(len(CHAIN)), tasks=tasks, now=T0)

    def decide(self, *, stale: frozenset[str] = frozenset(), write: bool = True) -> None:
        """One pass of a controller that knows nothing but this status (a fresh one after a restart)."""
        step = advance(self.diagnosis, self.world(stale))
        if write:
            self.diagnosis = msgspec.structs.replace(self.diagnosis, status=step.status)
        for task in step.create:
            self.tasks.setdefault(task.metadata.name, task)  # an existing name is that very Task: 409

    def end(self, index: int) -> None:
        """The edge reports the ``index``-th Task (in name order) ended; again if it has (the same report)."""
        names = sorted(self.tasks)
        if not names:
            return
        name = names[index % len(names)]
        task = self.tasks[name]
        outcome = self.outcomes[task.spec.node_name]
        phase = TaskPhase.SUCCEEDED if outcome is Outcome.OK else TaskPhase.FAILED
        results = {"v": name} if phase is TaskPhase.SUCCEEDED else {}
        # A report sent again (its acknowledgement lost) writes the same phase and results again.
        self.tasks[name] = msgspec.structs.replace(
            task, status=msgspec.structs.replace(task.status, phase=phase, results=results)
        )
        self.ended[name] = phase

    def downgrade(self) -> None:
        """The status as a controller of before the bitmap writes it: the counted Tasks' names instead."""
        status = self.diagnosis.status
        cp = status.checkpoint
        if cp is None or status.phase in FINAL_PHASES:
            return
        plan = _plan()
        stage = plan.stage(plan.action_at(cp.path_index, cp.node_index))
        every = [task_name(self.diagnosis, n, stage) for n in status.node_names]
        counted = counted_nodes(cp, every)
        names = tuple(name for i, name in enumerate(every) if i in counted)
        old = msgspec.structs.replace(cp, synchronized_nodes=msgspec.UNSET, synchronized_tasks=names)
        self.diagnosis = msgspec.structs.replace(self.diagnosis, status=msgspec.structs.replace(status, checkpoint=old))

    def check(self) -> None:
        """Each counted node's Task of the checkpoint's stage has ended, and is counted as what it ended as."""
        status = self.diagnosis.status
        cp = status.checkpoint
        assert cp is not None
        plan = _plan()
        stage = plan.stage(plan.action_at(cp.path_index, cp.node_index))
        names = [task_name(self.diagnosis, n, stage) for n in status.node_names]
        counted = counted_nodes(cp, names)
        phases = [self.ended.get(names[i]) for i in range(len(names)) if i in counted]
        assert None not in phases
        assert cp.succeeded == phases.count(TaskPhase.SUCCEEDED)
        assert cp.failed == len(phases) - cp.succeeded
        assert cp.active == cp.desired - cp.succeeded - cp.failed
        if status.phase not in FINAL_PHASES:
            assert cp.synchronized_tasks is msgspec.UNSET or cp.synchronized_nodes is msgspec.UNSET


Action = tuple[str, int, frozenset[int]]


def _plan() -> PathFlow:
    pipeline = pipeline_of(operation_set(CHAIN))
    assert isinstance(pipeline, Pipeline)
    return pipeline.plan


def actions() -> st.SearchStrategy[list[Action]]:
    """Edges reporting (some twice), passes seeing some ended Tasks still running (a cache behind), passes whose
    write is lost (a controller dying), and restarts on an older controller's status, in any order."""
    stale = st.frozensets(st.integers(min_value=0, max_value=7), max_size=4)
    kinds = st.sampled_from(("end", "end", "pass", "pass", "lost", "stale", "downgrade"))
    return st.lists(st.tuples(kinds, st.integers(min_value=0, max_value=30), stale), max_size=60)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from((Outcome.OK, Outcome.OK, Outcome.FAIL)), min_size=1, max_size=8),
    actions(),
)
def test_each_task_is_counted_once_whatever_order_repeats_and_restarts(
    outcomes: list[Outcome], script: list[Action]
) -> None:
    """Whatever order the Tasks end in, however often their reports arrive, whatever each pass sees of them,
    whichever writes are lost and wherever an older controller's status (Task names) is taken over, every
    written checkpoint counts exactly the ended Tasks it records, each as what it ended as; the run then ends
    with every Task of its last stage counted once."""
    nodes = tuple(f"n{i}" for i in range(len(outcomes)))
    stage = Stage(diagnosis(nodes), dict(zip(nodes, outcomes, strict=True)))
    first = start(stage.diagnosis, stage.world(), Resolution(nodes))
    stage.diagnosis = msgspec.structs.replace(
        stage.diagnosis,
        metadata=msgspec.structs.replace(stage.diagnosis.metadata, labels={**first.labels}),
        status=first.status,
    )
    for kind, index, stale in script:
        match kind:
            case "end":
                stage.end(index)
            case "pass" | "lost":
                stage.decide(write=kind == "pass")
            case "stale":
                names = sorted(stage.tasks)
                stage.decide(stale=frozenset(names[i % len(names)] for i in stale) if names else frozenset())
            case _:
                stage.downgrade()
        stage.check()
    for _ in range(4 * len(nodes) + 4):
        if stage.diagnosis.status.phase in FINAL_PHASES:
            break
        stage.decide()
        for name in sorted(stage.tasks):
            if name not in stage.ended:
                stage.end(sorted(stage.tasks).index(name))
        stage.check()
    status = stage.diagnosis.status
    assert status.phase in FINAL_PHASES
    assert status.checkpoint is not None
    assert status.checkpoint.succeeded + status.checkpoint.failed == len(nodes)
    assert status.context is not None
    succeeded = {n for n, p in stage.ended.items() if p is TaskPhase.SUCCEEDED}
    assert {t for tasks in status.context.operations.values() for t in tasks} == succeeded


# ---------------------------------------------------------------------------------------------- the record


@given(
    st.integers(min_value=0, max_value=100).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.integers(min_value=0, max_value=max(0, n - 1)), max_size=n))
    )
)
def test_the_counted_nodes_read_back_as_written(case: tuple[int, set[int]]) -> None:
    """Any set of nodes encodes to base64 that decodes to the same set; the empty set is left out (unset)."""
    size, members = case
    members = {m for m in members if m < size}
    counted = CountedNodes(size)
    for i in members:
        counted.add(i)
    text = counted.encode()
    again = CountedNodes.decode(text, size)
    assert {i for i in range(size) if i in again} == members
    assert len(again) == len(members)
    assert (text is msgspec.UNSET) == (not members)


@pytest.mark.parametrize(
    ("text", "size", "words"),
    [
        ("not base64!", 8, "is not base64"),
        ("AAAB", 16, "past the 16"),  # a third byte for two bytes' worth of nodes
        ("/w==", 5, "past the 5"),  # bits 5 to 7 of the only byte
    ],
)
def test_a_record_that_cannot_be_read_is_refused_saying_why(text: str, size: int, words: str) -> None:
    """Text that is not base64, or sets a bit past the last target node, is refused naming the field."""
    with pytest.raises(InvalidCountError, match=words):
        CountedNodes.decode(text, size)


def test_an_older_controllers_names_are_read_as_the_nodes_they_count() -> None:
    """``synchronizedTasks`` from before the bitmap counts the nodes whose Tasks it names; a name not of the
    stage, or counts that do not add up, are refused."""
    names = ["d.x.a.0.0.op", "d.x.b.0.0.op", "d.x.c.0.0.op"]
    old = Checkpoint(desired=3, active=1, succeeded=1, failed=1, synchronized_tasks=(names[2], names[0]))
    counted = counted_nodes(old, names)
    assert [i in counted for i in range(3)] == [True, False, True]
    with pytest.raises(InvalidCountError, match="not a Task of this stage"):
        counted_nodes(msgspec.structs.replace(old, synchronized_tasks=("d.x.z.0.0.op",)), names)
    with pytest.raises(InvalidCountError, match="counts 2 ended Tasks"):
        counted_nodes(msgspec.structs.replace(old, synchronized_tasks=(names[0],)), names)


def test_a_diagnosis_whose_checkpoint_cannot_be_read_fails_saying_so() -> None:
    """A running Diagnosis whose record of counted Tasks was edited into nonsense fails with InvalidCheckpoint,
    rather than counting some Task twice or never."""
    run = Run(
        successors=CHAIN,
        outcome=lambda g, n: Outcome.SILENT,
        diagnosis=diagnosis(("a", "b")),
        opset=operation_set(CHAIN),
        ops=operations(len(CHAIN)),
    )
    run.begin()
    run.turn()
    status = run.diagnosis.status
    assert status.checkpoint is not None
    broken = msgspec.structs.replace(status.checkpoint, synchronized_nodes="Aw==")  # two counted, none ended
    edited: DiagnosisStatus = msgspec.structs.replace(status, checkpoint=broken)
    step = advance(msgspec.structs.replace(run.diagnosis, status=edited), run.world())
    assert step.status.phase is DiagnosisPhase.FAILED
    [complete] = [c for c in step.status.conditions if c.type == "Complete"]
    assert complete.reason == "InvalidCheckpoint"
    assert "counts 0 ended Tasks" in complete.message
