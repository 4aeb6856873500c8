"""A processor's verdict, and the bounds every verdict's results are kept within.

Results go into the Task's status (an object in etcd, 1.5 MiB at most), into the Diagnosis's
context and into the request of the next stage on the path, so each value is clipped to
:data:`MAX_VALUE_CHARS` and all of them together may not exceed
:data:`flows.diagnosis.job.MAX_RESULTS_BYTES` as JSON, the bound the hub checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from flows.diagnosis.job import MAX_RESULTS_BYTES, results_bytes

__all__ = ["MAX_VALUE_CHARS", "ProcessorOutcome", "bounded", "clip_value", "failed"]

MAX_VALUE_CHARS: Final = 64 << 10
"""The most characters one result value keeps; a longer one ends in :func:`clip_value`'s marker."""
REASON_CHARS: Final = 512
"""The most characters of outside text (a response body, stderr) a failure reason quotes."""


@dataclass(frozen=True, slots=True)
class ProcessorOutcome:
    """A processor's verdict: its results on success, why it failed otherwise."""

    succeeded: bool
    results: Mapping[str, str] = field(default_factory=dict)
    reason: str = ""


def failed(reason: str) -> ProcessorOutcome:
    return ProcessorOutcome(succeeded=False, reason=reason)


def clip_value(value: str, limit: int = MAX_VALUE_CHARS) -> str:
    """``value``, or its first ``limit`` characters followed by a marker saying how long it was."""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}\n... (clipped: {len(value)} characters in all)"


def bounded(outcome: ProcessorOutcome) -> ProcessorOutcome:
    """``outcome`` with each result value clipped; a failure instead if the results are still too large.

    A failure may carry results too (what a probe found, say); they are clipped the same way, and
    dropped if still too large, so the failure's reason always gets through.
    """
    if not outcome.results:
        return outcome
    results = {key: clip_value(value) for key, value in outcome.results.items()}
    size = results_bytes(results)
    if size <= MAX_RESULTS_BYTES:
        return ProcessorOutcome(succeeded=outcome.succeeded, results=results, reason=outcome.reason)
    if not outcome.succeeded:
        return ProcessorOutcome(succeeded=False, reason=outcome.reason)
    return failed(
        f"the results ({len(results)} keys) are {size} bytes as JSON,"
        f" more than the {MAX_RESULTS_BYTES} a Task may carry"
    )
