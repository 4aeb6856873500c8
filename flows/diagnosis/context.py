"""What a Diagnosis's ``status.context`` keeps of its Tasks' results: as much as fits in a fixed budget.

Each Task may report up to 256 KiB of results (:data:`flows.diagnosis.job.MAX_RESULTS_BYTES`), and
KubeDiag copies every Task's results into the Diagnosis's status. A few Tasks that report much, or a
thousand nodes that report a little, would push the Diagnosis past etcd's 1.5 MiB object limit,
after which no status write succeeds and the run can neither go on nor fail. So the context keeps
results only while they fit in :data:`MAX_CONTEXT_BYTES` (counted as JSON). The first Task whose
results do not fit sets the ``ContextClipped`` condition, naming it, and from then on no results
are copied: each Task keeps its own in ``status.results``, and the next stages' request data is
read from there (:func:`flows.diagnosis.tasks.task_parameters`), so what the run passes on is whole.

The budget, with the target names, keeps a Diagnosis of a few thousand nodes under etcd's limit;
the run also gives the context less when the rest of the Diagnosis leaves less room
(:mod:`flows.diagnosis.size`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Final

import msgspec

from flows.diagnosis.conditions import find_condition, set_condition
from nodetask.phases import ConditionStatus
from schemas.diagnosis.v1 import Condition, DiagnosisContext

__all__ = ["CONTEXT_CLIPPED", "MAX_CONTEXT_BYTES", "ContextBudget", "clipped_condition"]

MAX_CONTEXT_BYTES: Final = 512 * 1024
"""The most bytes of JSON that ``status.context.operations`` holds."""
CONTEXT_CLIPPED: Final = "ContextClipped"
"""The condition type (and reason) that says results were left out of the context."""

_ENCODE: Final = msgspec.json.encode


def clipped_condition(task: str, *, limit: int) -> Condition:
    """The ``ContextClipped`` condition of a run whose context filled up at ``task``."""
    return Condition(
        type=CONTEXT_CLIPPED,
        status=ConditionStatus.TRUE,
        reason=CONTEXT_CLIPPED,
        message=(
            f"status.context holds at most {limit} bytes of results: the results of Task {task} and of every"
            " Task after it are not copied here; each Task keeps its own in status.results"
        ),
    )


class ContextBudget:
    """The context of one decision and what it has used of ``limit``; :meth:`add` each Task's results."""

    def __init__(self, context: DiagnosisContext, conditions: tuple[Condition, ...], *, limit: int) -> None:
        self._context = context
        self._operations: dict[str, dict[str, dict[str, str]]] | None = None
        """A copy of the context's operations, made at the first addition and added to in place."""
        self._used = -1
        """Bytes of the operations as JSON: counted at the first addition, then an upper bound."""
        self.conditions = conditions
        self.limit = limit

    @property
    def context(self) -> DiagnosisContext:
        if self._operations is None:
            return self._context
        return msgspec.structs.replace(self._context, operations=self._operations)

    @property
    def clipped(self) -> bool:
        found = find_condition(self.conditions, CONTEXT_CLIPPED)
        return found is not None and found.status is ConditionStatus.TRUE

    def add(self, operation: str, task: str, results: Mapping[str, str], now: datetime) -> None:
        """Copy ``task``'s results under ``operation`` if they fit; else mark the context clipped from it on."""
        if self.clipped:
            return
        if self._operations is None:
            self._operations = {op: dict(tasks) for op, tasks in self._context.operations.items()}
            self._used = len(_ENCODE(self._operations))
        entry = len(_ENCODE(task)) + len(_ENCODE(dict(results))) + 2  # its colon and a comma
        if operation not in self._operations:
            entry += len(_ENCODE(operation)) + 4  # its colon, braces and a comma
        if self._used + entry > self.limit:
            self.conditions = set_condition(self.conditions, clipped_condition(task, limit=self.limit), now)
            return
        self._used += entry
        self._operations.setdefault(operation, {})[task] = dict(results)
