"""The test nodes' stand-in for systemd keeps its command running, restarts it on SIGHUP and stops on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.provision import node_host

SUPERVISE = Path(__file__).resolve().parents[3] / "tools" / "provision" / "supervise.py"


def _pids(record: Path, count: int, limit_s: float = 20.0) -> list[int]:
    """The first ``count`` PIDs the command wrote, waiting for them."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        pids = [int(line) for line in record.read_text().split()] if record.exists() else []
        if len(pids) >= count:
            return pids
        time.sleep(0.05)
    pytest.fail(f"the command started {count} times? {record} says {record.read_text() if record.exists() else ''!r}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return state != "Z"


@pytest.fixture
def supervisor(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    record = tmp_path / "pids"
    command = ["sh", "-c", f"echo $$ >> {record}; exec sleep 600"]
    process = subprocess.Popen([sys.executable, str(SUPERVISE), "--", *command], stdout=subprocess.DEVNULL)
    try:
        yield process, record
    finally:
        process.kill()
        process.wait()


def test_sighup_restarts_the_command_and_an_exit_is_followed_by_a_new_start(
    supervisor: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """SIGHUP replaces the running command with a new process; killing that one brings a third."""
    process, record = supervisor
    (first,) = _pids(record, 1)
    process.send_signal(signal.SIGHUP)
    second = _pids(record, 2)[1]
    assert second != first
    assert not _alive(first)
    os.kill(second, signal.SIGKILL)
    third = _pids(record, 3)[2]
    assert _alive(third)


def test_sigterm_stops_the_command_and_the_supervisor(supervisor: tuple[subprocess.Popen[bytes], Path]) -> None:
    """The supervisor exits 0 once its command is gone, and starts nothing more."""
    process, record = supervisor
    (first,) = _pids(record, 1)
    process.terminate()
    assert process.wait(timeout=20) == 0
    assert not _alive(first)
    assert len(record.read_text().split()) == 1


def test_without_a_command_it_says_how_to_call_it() -> None:
    """A call without ``--`` and a command is a usage error (exit 2)."""
    done = subprocess.run([sys.executable, str(SUPERVISE)], capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert "usage: supervise.py -- COMMAND" in done.stderr


def test_a_restart_through_the_node_tools_returns_once_the_new_process_runs(
    supervisor: tuple[subprocess.Popen[bytes], Path],
) -> None:
    """``restart_supervised`` (what ``node.py restart-kubelet`` does) waits, as ``systemctl restart`` does."""
    process, record = supervisor
    (first,) = _pids(record, 1)
    node_host.restart_supervised(process.pid, timeout=20)
    assert not _alive(first)
    assert len(_pids(record, 2)) == 2
