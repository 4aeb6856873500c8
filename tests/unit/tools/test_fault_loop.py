"""The flake hunt's tally: which test passed in which run, read from pytest's JUnit reports."""

from __future__ import annotations

from pathlib import Path

from tools.fault_loop import outcomes, table

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
  <testcase classname="tests.integration.test_faults" name="test_ok" time="1.0"/>
  <testcase classname="tests.integration.test_faults" name="test_bad" time="1.0"><failure message="x"/></testcase>
  <testcase classname="tests.integration.test_faults" name="test_broken" time="1.0"><error message="y"/></testcase>
  <testcase classname="tests.integration.test_faults" name="test_skipped" time="0"><skipped message="z"/></testcase>
</testsuite></testsuites>
"""


def test_a_report_counts_failures_and_errors_as_not_passed_and_leaves_skips_out(tmp_path: Path) -> None:
    """A failure and a set-up error are both a failed run of that test; a skipped test is no run at all."""
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT)
    assert outcomes(junit) == {
        "tests.integration.test_faults::test_ok": True,
        "tests.integration.test_faults::test_bad": False,
        "tests.integration.test_faults::test_broken": False,
    }


def test_the_table_puts_tests_that_ever_failed_first_with_their_pass_counts() -> None:
    """Each test's passes out of its runs, the flaky ones on top."""
    text = table({"a::steady": [True, True, True], "b::flaky": [True, False, True]})
    assert text.splitlines() == ["b::flaky   2/3", "a::steady  3/3"]
