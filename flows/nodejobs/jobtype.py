"""What a job type is made of, and the status merge every job type shares.

A report from an edge becomes a node status change here, as a pure function: append one
``actionFlow`` entry, derive the node phase with the final-action rule, and let the job type read
``extend``. Beyond KubeEdge: ``time`` is always set, ``reason`` is kept for every kind, a report
already applied is recognised (no second entry) and a terminal node never moves backwards, except
Unknown (the controller's timeout verdict), which a real result may overturn.

Large jobs keep a compact entry for each node that succeeded (:func:`compact`): KubeEdge's entry
costs about 340 bytes a node, which takes a job object past 1 MiB at about 3,000 nodes and past
etcd's request limit (1.5 MiB) at about 4,500, after which no status write is accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import msgspec

from nodetask.flow import Flow, UnknownActionError
from nodetask.messages import ActionResult
from nodetask.phases import ConditionStatus, NodeTaskPhase
from schemas.kinds import Kind
from schemas.v1alpha2 import ActionStatus, NodeTaskStatus

__all__ = [
    "EdgeJobType",
    "ExtendError",
    "JobType",
    "NextStep",
    "Verdict",
    "apply_result",
    "compact",
    "default_verdict",
    "next_step",
    "resume_at",
    "rollback_is_failure",
]


class ExtendError(ValueError):
    """A report's ``extend`` payload does not have the job type's format."""


E = TypeVar("E", bound=NodeTaskStatus)


class Verdict(msgspec.Struct, frozen=True):
    """A node's phase and reason after a report."""

    phase: NodeTaskPhase
    reason: str


def default_verdict(flow: Flow, result: ActionResult) -> Verdict:
    """KubeEdge's rule: final and ok is Successful, final and failed is Failure, else InProgress."""
    if not flow.is_final(result.action, result.succ):
        return Verdict(NodeTaskPhase.IN_PROGRESS, "")
    if result.succ:
        return Verdict(NodeTaskPhase.SUCCESSFUL, "")
    return Verdict(NodeTaskPhase.FAILURE, result.reason or f"action {result.action} failed")


def rollback_is_failure(roll_back: str, reason: str) -> Callable[[Flow, ActionResult], Verdict]:
    """A verdict where a completed ``roll_back`` action ends the node task as a failure.

    KubeEdge counts a successful rollback as a successful node task, which hides a change that did
    not happen inside a Completed job; nodetaskd reports it as Failure with ``reason``, followed by the
    rollback's own reason when it gives one (what failed).
    """

    def verdict(flow: Flow, result: ActionResult) -> Verdict:
        if result.action == roll_back and result.succ:
            flow.step(result.action)
            return Verdict(NodeTaskPhase.FAILURE, f"{reason}: {result.reason}" if result.reason else reason)
        return default_verdict(flow, result)

    return verdict


@dataclass(frozen=True, slots=True)
class JobType:
    """Everything job-type specific that is not a device action (those live in ``roles/edge``)."""

    kind: Kind
    flow: Flow
    spec_type: type[msgspec.Struct]
    """The v1alpha2 spec Struct sent to edges in ``RunAction.spec``."""
    verdict: Callable[[Flow, ActionResult], Verdict] = default_verdict
    read_extend: Callable[[str], Mapping[str, Any]] = lambda _: {}
    """Parses ``extend`` into node-status field updates; raises :class:`ExtendError`."""
    drop_success_detail: Callable[[Any], Any] = lambda entry: entry
    """A succeeded node's entry without the per-item detail that only repeats its success."""
    exclusive: bool = False
    """Whether a node task holds the node's one slot for agent-changing work (upgrade, config update)
    from its Check until it finishes."""
    confirmation: str | None = None
    """The action after whose success a node task pauses for confirmation, when :attr:`asks_confirmation`."""
    asks_confirmation: Callable[[Any], bool] = lambda spec: False
    """Whether a decoded spec asks for confirmation before the flow goes on past :attr:`confirmation`."""

    @property
    def resource_type(self) -> str:
        return self.kind.resource_type

    def decode_spec(self, raw: bytes) -> msgspec.Struct:
        """Decode a spec sent in ``RunAction``; raises ``msgspec.ValidationError`` naming the field."""
        spec: msgspec.Struct = msgspec.json.decode(raw, type=self.spec_type)
        return spec

    def read_spec(self, raw: bytes) -> tuple[msgspec.Struct | None, str]:
        """The spec sent in ``RunAction`` and an empty error, or None and why it does not decode."""
        try:
            return self.decode_spec(raw), ""
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return None, f"the job spec is invalid: {exc}"


class EdgeJobType(Protocol):
    """What the edge's task walk needs of a job type: :class:`JobType` has it, and so has a diagnosis Task's
    (:mod:`flows.diagnosis.job`), whose status is not a node job's and which the hub runs apart."""

    @property
    def resource_type(self) -> str: ...

    @property
    def flow(self) -> Flow: ...

    @property
    def exclusive(self) -> bool: ...

    @property
    def confirmation(self) -> str | None: ...

    @property
    def asks_confirmation(self) -> Callable[[Any], bool]: ...

    def read_spec(self, raw: bytes) -> tuple[msgspec.Struct | None, str]: ...


class NextStep(msgspec.Struct, frozen=True):
    """What follows an action's result on the device."""

    action: str | None
    """The next action; None when the node task is finished."""
    pause: bool = False
    """Wait for confirmation before running :attr:`action`."""


def next_step(job_type: EdgeJobType, spec: Any, action: str, succ: bool) -> NextStep:
    """The step after ``action`` ended with ``succ``, for a task whose decoded spec is ``spec``. Pure.

    An action the flow does not know ends the task (its failure is what gets reported).
    """
    try:
        after = job_type.flow.next(action, succ)
    except UnknownActionError:
        return NextStep(None)
    pause = after is not None and action == job_type.confirmation and job_type.asks_confirmation(spec)
    return NextStep(after, pause)


def resume_at(job_type: EdgeJobType, current: str, done: Mapping[str, bool]) -> str | None:
    """Where a node task resumes: ``current``, or past it along the results already recorded in ``done``
    (action to success), so that no recorded action runs twice; None when they finish the task. Pure."""
    action: str | None = current
    seen: set[str] = set()
    while action is not None and action in done and action not in seen:
        seen.add(action)
        try:
            action = job_type.flow.next(action, done[action])
        except UnknownActionError:
            return None
    return action


def apply_result(job_type: JobType, entry: E, result: ActionResult, *, now: str) -> E | None:
    """The node entry after ``result``, or None when this action was already recorded.

    ``actionFlow`` stays in flow order whatever order reports arrive in; only the newest action
    decides the phase and reads ``extend``.

    Errors:
        ``flow.UnknownActionError`` for an action the job type does not have;
        :class:`ExtendError` for a malformed ``extend``.
    """
    verdict = job_type.verdict(job_type.flow, result)  # validates the action name first
    if any(done.action == result.action for done in entry.action_flow):
        return None
    record = ActionStatus(
        action=result.action,
        status=ConditionStatus.TRUE if result.succ else ConditionStatus.FALSE,
        reason="" if result.succ else result.reason,
        time=result.finish_time or now,
    )
    depth = _positions(job_type.flow)
    history = tuple(sorted((*entry.action_flow, record), key=lambda a: depth.get(a.action, -1)))
    settled = entry.phase in (NodeTaskPhase.SUCCESSFUL, NodeTaskPhase.FAILURE)
    if settled or history[-1] is not record:
        # A late report (or one after the node settled) is recorded but moves nothing backwards.
        return msgspec.structs.replace(entry, action_flow=history)
    updates = dict(job_type.read_extend(result.extend)) if result.extend else {}
    return msgspec.structs.replace(entry, action_flow=history, phase=verdict.phase, reason=verdict.reason, **updates)


def compact(job_type: JobType, entry: E) -> E:
    """``entry`` as a large job keeps it once the node succeeded: only its last action, and none of
    the job type's per-item detail that merely repeats the success. Other entries are unchanged.

    Nothing that decides a phase is lost: a succeeded node is final, its last action and ``time``
    say when and how it finished, and failed or running nodes keep every detail.
    """
    if entry.phase is not NodeTaskPhase.SUCCESSFUL:
        return entry
    slim: E = job_type.drop_success_detail(msgspec.structs.replace(entry, action_flow=entry.action_flow[-1:]))
    return slim


def _positions(flow: Flow) -> dict[str, int]:
    # Depth from the first action; flows are acyclic, so a report for a shallower action than one
    # already recorded can only be a late duplicate of an earlier step.
    depth = {flow.first: 0}
    frontier = [flow.first]
    while frontier:
        action = frontier.pop()
        step = flow.steps[action]
        for target in (step.on_success, step.on_failure):
            if target is not None and depth.get(target, -1) < depth[action] + 1:
                depth[target] = depth[action] + 1
                frontier.append(target)
    return depth
