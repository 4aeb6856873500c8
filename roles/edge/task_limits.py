"""What one device takes of diagnosis Tasks: how much request data, while its store is under quota, how many at once.

Whoever may create a Diagnosis chooses how much data each of its Tasks carries (a hub sends up to
768 KiB) and, with enough Diagnoses, how many Tasks a device holds. So:

* a new Task fails on arrival, nothing of its data stored, when its request data is over
  ``diagnosis.maxRequestBytes`` (:func:`request_refusal`) or the store already holds
  ``storeQuotaBytes`` (:func:`quota_refusal`); a re-delivered one is answered as before. Node jobs are
  never refused here: their specs are the controller's, bounded by their schemas, and they are how an
  operator repairs a device;
* at most ``diagnosis.maxConcurrentTasks`` Tasks are walked at once (:class:`Turns`). The others wait
  their turn holding nothing of their data in memory, each for at most its operation's
  ``timeoutSeconds`` (after which the controller gives up on it anyway), then fail naming the setting.
  Waiting, not refusing, because Diagnoses started together are no fault of anyone's.

Each reason names the setting of the device's config that would take the Task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, final

import anyio
import msgspec

from flows.diagnosis.job import TaskRun

__all__ = ["Turns", "diagnosis_turns", "quota_refusal", "request_refusal", "turn_patience"]

_SPEC: Final = msgspec.json.Decoder(TaskRun)


def request_refusal(spec: bytes, limit: int) -> str:
    """Why a Task whose RunAction carries ``spec`` is refused for its request data (over ``limit`` bytes as
    JSON, or a spec that does not decode), or "" when it is not."""
    if len(spec) <= limit:
        return ""  # the request data is part of the spec
    try:
        run = _SPEC.decode(spec)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        return f"the task spec is invalid: {exc}"
    size = len(msgspec.json.encode(run.request))
    if size <= limit:
        return ""
    return (
        f"the Task's request data is {size} bytes as JSON, more than the {limit} this node takes"
        " (diagnosis.maxRequestBytes in its config)"
    )


def quota_refusal(used: int, quota: int) -> str:
    """Why a new Task is refused while the store holds ``used`` bytes of its ``quota``, or "" when it is not."""
    if used < quota:
        return ""
    return (
        f"the node's store holds {used} bytes, at its quota of {quota} (storeQuotaBytes in its config):"
        " it takes no new Task until finished ones are forgotten"
    )


def turn_patience(spec: bytes) -> float | None:
    """How long a Task with ``spec`` waits for its turn at most: its operation's ``timeoutSeconds``. None for a
    spec that does not decode (its walk fails at once, running nothing)."""
    try:
        return float(_SPEC.decode(spec).processor.timeout_seconds)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


@final
class Turns:
    """At most ``limit`` tasks of one job type at once; :meth:`acquire` waits (fairly) for a turn, for at most
    what ``patience`` says of the task's spec."""

    def __init__(self, limit: int, *, setting: str, patience: Callable[[bytes], float | None]) -> None:
        self.limit = limit
        self.setting = setting
        self.patience = patience
        self._limiter = anyio.CapacityLimiter(limit)

    async def acquire(self) -> None:
        """Wait for a turn; the calling task holds it until :meth:`release`."""
        await self._limiter.acquire()

    def release(self) -> None:
        """Give back the calling task's turn."""
        self._limiter.release()

    def missed(self, waited: float) -> str:
        """The failure of a task that got no turn within ``waited`` seconds."""
        return (
            f"no turn to run within {waited:g} s (the operation's timeoutSeconds): {self.limit} Tasks ran on"
            f" this node all that time ({self.setting} in its config)"
        )


def diagnosis_turns(limit: int) -> Turns:
    """The turns of a device's diagnosis Tasks (``diagnosis.maxConcurrentTasks``)."""
    return Turns(limit, setting="diagnosis.maxConcurrentTasks", patience=turn_patience)
