"""Run the fault suite (or any tests) many times in a row and count each test's passes: a flake hunt.

    .venv/bin/python -m tools.fault_loop --runs 20                 # the fault suite, 20 times
    .venv/bin/python -m tools.fault_loop --runs 5 tests/integration/test_faults.py -k restart

Each run is a fresh pytest process (its own control plane, as on a fresh machine); a run's JUnit
report and, for a failed test, its kept role logs (see ``tests/integration/conftest.py``) stay in
``--out``. The table at the end is the closing-note figure: passes per test out of runs. Exits 1 if
any test failed in any run.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Final

REPO: Final = Path(__file__).resolve().parents[1]
FAULT_SUITE: Final = (
    "tests/integration/test_faults.py",
    "tests/integration/test_connect_storm.py",
    "tests/integration/test_retry.py",
    "tests/integration/test_autonomy_e2e.py",
)
"""Process kills, an API server restart, a black-holed link, a connect storm, the retry's handover
between controllers, and the device answering while its hub is gone."""


def outcomes(junit: Path) -> dict[str, bool]:
    """Each test case of a JUnit report (``file::name``) and whether it passed; skipped ones are left out."""
    results: dict[str, bool] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        results[name] = case.find("failure") is None and case.find("error") is None
    return results


def table(tally: dict[str, list[bool]]) -> str:
    """One line a test: its passes out of its runs, failures first."""
    rows = sorted(tally.items(), key=lambda item: (all(item[1]), item[0]))
    width = max((len(name) for name in tally), default=0)
    return "\n".join(f"{name:<{width}}  {sum(runs)}/{len(runs)}" for name, runs in rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="how many times to run the tests (default 20)")
    parser.add_argument("--out", type=Path, default=REPO / "test-logs" / "fault-loop", help="reports and kept logs")
    parser.add_argument("pytest_args", nargs="*", help="tests and pytest options (default: the fault suite)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    tests = args.pytest_args or list(FAULT_SUITE)
    tally: dict[str, list[bool]] = collections.defaultdict(list)
    for run in range(1, args.runs + 1):
        folder = args.out / f"run-{run:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        junit = folder / "junit.xml"
        env = {**os.environ, "NODETASKD_TEST_LOGS": str(folder / "logs")}
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests]
        started = time.monotonic()
        with (folder / "output.txt").open("wb") as output:
            code = subprocess.run(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT, check=False)
        found = outcomes(junit) if junit.exists() else {}
        for name, passed in found.items():
            tally[name].append(passed)
        failed = sorted(name for name, passed in found.items() if not passed)
        elapsed = time.monotonic() - started
        print(
            f"run {run}/{args.runs}: exit {code.returncode}, {len(found)} tests, {len(failed)} failed, {elapsed:.0f} s"
        )
        for name in failed:
            print(f"  failed: {name} (output and logs in {folder})")
        if not found:
            print(f"  no test report: see {folder / 'output.txt'}")
            tally["(run produced no report)"].append(False)
        sys.stdout.flush()
    print(table(tally))
    return 0 if all(all(runs) for runs in tally.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
