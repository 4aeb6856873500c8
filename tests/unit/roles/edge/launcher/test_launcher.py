"""The launcher relaunches the agent, keeps a healthy new version and rolls back one that is not.

The "agent" here is a short Python script in a real child process, acting out one behaviour.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import structlog

from roles.common.restart import EXIT_RESTART, SUPERVISOR_ENV
from roles.edge.launcher.launcher import supervise
from roles.edge.upgrade.marker import (
    MARKER_FILE,
    MarkerState,
    UpgradeMarker,
    current_target,
    read_marker,
    switch_current,
    write_marker,
)

LOG = structlog.get_logger()


def _on_probation(data_dir: Path, deadline: float = 30.0) -> None:
    (data_dir / "versions" / "v0.2.0").mkdir(parents=True)
    write_marker(
        data_dir,
        UpgradeMarker(
            job_uid="uid-1",
            from_version="v0.1.0",
            to_version="v0.2.0",
            previous="",
            state=MarkerState.SWITCHED,
            deadline_s=deadline,
        ),
    )
    switch_current(data_dir, "versions/v0.2.0")


def _script(body: str) -> list[str]:
    return [sys.executable, "-c", body]


async def test_a_restart_request_relaunches_the_agent_on_the_current_version(tmp_path: Path) -> None:
    """Exit 75 starts the agent again at once, with `current` on PYTHONPATH and the supervisor flag set."""
    switch_current(tmp_path, "versions/v0.2.0")
    (tmp_path / "versions" / "v0.2.0").mkdir(parents=True)
    runs = tmp_path / "runs"
    body = (
        "import os, sys, pathlib\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "seen = runs.read_text() if runs.exists() else ''\n"
        "first = os.environ['PYTHONPATH'].split(os.pathsep)[0]\n"
        f"runs.write_text(seen + first + ' ' + os.environ[{SUPERVISOR_ENV!r}] + '\\n')\n"
        f"sys.exit({EXIT_RESTART} if not seen else 0)\n"
    )
    with anyio.fail_after(20):
        status = await supervise(_script(body), tmp_path, log=LOG)
    assert status == 0
    assert runs.read_text().splitlines() == [f"{tmp_path / 'current'} launcher"] * 2


async def test_a_new_version_that_reports_healthy_is_kept(tmp_path: Path) -> None:
    """The marker turning healthy ends the probation; `current` stays on the new version."""
    _on_probation(tmp_path, deadline=3.0)
    marker_file = tmp_path / MARKER_FILE
    # Standard library only, so that even a loaded machine starts it well within the deadline; it then
    # outlives the launcher's deadline and grace (counted from before this process started).
    body = (
        "import json, os, pathlib, time\n"
        "started = time.monotonic()\n"
        f"marker = pathlib.Path({str(marker_file)!r})\n"
        "record = json.loads(marker.read_text())\n"
        f"record['state'] = {MarkerState.HEALTHY.value!r}\n"
        "marker.with_name('healthy.tmp').write_text(json.dumps(record))\n"
        "os.replace(marker.with_name('healthy.tmp'), marker)\n"
        "time.sleep(max(0.0, started + 3.5 - time.monotonic()))\n"
    )
    with anyio.fail_after(20):
        status = await supervise(_script(body), tmp_path, log=LOG, grace=0.2)
    assert status == 0
    assert current_target(tmp_path) == "versions/v0.2.0"
    marker = read_marker(tmp_path)
    assert marker is not None
    assert marker.state is MarkerState.HEALTHY


async def test_a_new_version_that_crashes_at_start_is_rolled_back_after_three_tries(tmp_path: Path) -> None:
    """Three failed starts on probation point `current` back and start the previous version."""
    _on_probation(tmp_path)
    runs = tmp_path / "runs"
    body = (
        "import os, pathlib, sys\n"
        f"runs = pathlib.Path({str(runs)!r})\n"
        "runs.write_text((runs.read_text() if runs.exists() else '') + os.environ.get('PYTHONPATH', '') + '\\n')\n"
        "sys.exit(1 if os.environ.get('PYTHONPATH') else 0)\n"  # the new version crashes, the base one stops cleanly
    )
    with anyio.fail_after(20):
        status = await supervise(_script(body), tmp_path, log=LOG)
    assert status == 0
    assert runs.read_text().splitlines() == [str(tmp_path / "current")] * 3 + [""]
    marker = read_marker(tmp_path)
    assert marker is not None
    assert (marker.state, marker.reason) == (
        MarkerState.ROLLED_BACK,
        "v0.2.0 exited with status 1 3 times before it was healthy",
    )
    assert current_target(tmp_path) == ""


async def test_a_new_version_that_never_reports_healthy_is_stopped_and_rolled_back(tmp_path: Path) -> None:
    """Past the deadline (plus grace) the hung agent is terminated and the previous version started."""
    _on_probation(tmp_path, deadline=0.3)
    body = "import os, sys, time\nif not os.environ.get('PYTHONPATH'): sys.exit(0)\ntime.sleep(60)\n"
    with anyio.fail_after(20):
        status = await supervise(_script(body), tmp_path, log=LOG, grace=0.2)
    assert status == 0
    marker = read_marker(tmp_path)
    assert marker is not None
    assert (marker.state, marker.reason) == (MarkerState.ROLLED_BACK, "v0.2.0 did not report healthy within 0.3s")
    assert current_target(tmp_path) == ""


async def test_a_new_version_that_gives_up_on_its_health_check_is_rolled_back_with_its_reason(tmp_path: Path) -> None:
    """An agent marking itself unhealthy and asking for a restart gets the previous version back."""
    _on_probation(tmp_path)
    body = (
        "import os, pathlib, sys, msgspec\n"
        "from roles.edge.upgrade.marker import MarkerState, read_marker, write_marker\n"
        "if not os.environ.get('PYTHONPATH'): sys.exit(0)\n"
        f"d = pathlib.Path({str(tmp_path)!r})\n"
        "m = msgspec.structs.replace(read_marker(d), state=MarkerState.UNHEALTHY, reason='no hub within 1s')\n"
        f"write_marker(d, m); sys.exit({EXIT_RESTART})\n"
    )
    with anyio.fail_after(20):
        status = await supervise(_script(body), tmp_path, log=LOG)
    assert status == 0
    marker = read_marker(tmp_path)
    assert marker is not None
    assert (marker.state, marker.reason) == (MarkerState.ROLLED_BACK, "no hub within 1s")
    assert current_target(tmp_path) == ""
