"""What a benchmark run tells the person running it, on stderr: its progress, and each failed run at once
(listed again at the end by :mod:`bench.run`, whose exit status then says so)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

from bench.waits import Stalled


def log(message: str) -> None:
    sys.stderr.write(f"[bench] {message}\n")
    sys.stderr.flush()


def note_failure(failed: list[str], what: str, exc: Exception) -> None:
    """Note a failed run: logged at once, listed again at the end, and the exit status says so."""
    reason = "; ".join(str(e) if isinstance(e, Stalled) else repr(e) for e in _leaves(exc))
    failed.append(f"{what}: {reason}")
    log(f"  FAILED: {reason}")


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """The exceptions inside the groups that task groups wrap them in."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
    else:
        yield exc
