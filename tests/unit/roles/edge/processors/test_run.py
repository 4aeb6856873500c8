"""processors.run: exactly one kind of processor, the operation's timeout, and results kept small."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.diagnosis.job import MAX_RESULTS_BYTES, decode_results, encode_results
from roles.edge import processors
from roles.edge.processors.outcome import MAX_VALUE_CHARS, ProcessorOutcome, bounded, clip_value
from schemas.processors import Builtin, Function, HTTPServer, Processor, ScriptRunner
from tests.unit.roles.edge.processors.doubles import make_env


@pytest.mark.parametrize(
    ("processor", "reason"),
    [
        (Processor(), "the processor names none of httpServer, scriptRunner and builtin"),
        (
            Processor(http_server=HTTPServer(), builtin=Builtin(name="agent.status")),
            "the processor names httpServer and builtin; exactly one is allowed",
        ),
        (
            Processor(function=Function(runtime="python3")),
            "the function processor (images built with Docker on the node) is not supported",
        ),
        (
            Processor(script_runner=ScriptRunner(script="x"), function=Function()),
            "the function processor (images built with Docker on the node) is not supported",
        ),
    ],
)
async def test_a_processor_without_exactly_one_supported_kind_fails_naming_why(
    processor: Processor, reason: str
) -> None:
    """run() never raises for a malformed processor: the failure's reason says what is wrong."""
    outcome = await processors.run(processor, {}, make_env())
    assert outcome == ProcessorOutcome(succeeded=False, reason=reason)


def test_a_long_value_is_clipped_with_a_marker() -> None:
    """A value over the cap keeps its head and says how long it was."""
    value = "a" * (MAX_VALUE_CHARS + 10)
    clipped = bounded(ProcessorOutcome(succeeded=True, results={"k": value})).results["k"]
    assert clipped == "a" * MAX_VALUE_CHARS + f"\n... (clipped: {MAX_VALUE_CHARS + 10} characters in all)"


def test_results_too_large_in_all_fail_the_run() -> None:
    """Many values each under the cap can still be too much for a Task: that is a failure saying so."""
    results = {f"k{i}": "v" * MAX_VALUE_CHARS for i in range(MAX_RESULTS_BYTES // MAX_VALUE_CHARS + 1)}
    outcome = bounded(ProcessorOutcome(succeeded=True, results=results))
    assert not outcome.succeeded
    assert f"more than the {MAX_RESULTS_BYTES} a Task may carry" in outcome.reason


def test_results_are_bounded_in_bytes_as_json_as_the_hub_bounds_them() -> None:
    """Results under the bound in characters but over it in UTF-8 bytes fail on the edge; what passes, the hub takes."""
    wide = {f"k{i}": "\u00e9" * MAX_VALUE_CHARS for i in range(3)}
    assert sum(len(k) + len(v) for k, v in wide.items()) < MAX_RESULTS_BYTES
    outcome = bounded(ProcessorOutcome(succeeded=True, results=wide))
    assert not outcome.succeeded
    assert "bytes as JSON" in outcome.reason
    fits = bounded(ProcessorOutcome(succeeded=True, results={"k": "\u00e9" * MAX_VALUE_CHARS}))
    assert fits.succeeded
    assert decode_results(encode_results(fits.results)) == fits.results


@given(
    st.dictionaries(st.text(max_size=20), st.text(max_size=300), max_size=20), st.integers(min_value=1, max_value=200)
)
def test_clipping_keeps_short_values_and_bounds_long_ones(results: dict[str, str], limit: int) -> None:
    """A value within the limit is unchanged; a longer one starts with its first ``limit`` characters."""
    for value in results.values():
        clipped = clip_value(value, limit)
        if len(value) <= limit:
            assert clipped == value
        else:
            assert clipped.startswith(value[:limit])
            assert len(clipped) < limit + 60


def test_a_failure_passes_through_unchanged() -> None:
    """A failure without results is returned as it is."""
    outcome = ProcessorOutcome(succeeded=False, reason="x")
    assert bounded(outcome) is outcome


def test_importing_the_processors_loads_none_of_them() -> None:
    """The agent imports the package at start; each kind, psutil, h11 and grpc wait for the first Task using them."""
    heavy = [
        "psutil",
        "h11",
        "grpc",
        "roles.edge.processors.http",
        "roles.edge.processors.scripts",
        "roles.edge.processors.builtins",
        "roles.edge.runtime.puller",
    ]
    code = f"import sys, roles.edge.processors; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
