"""The agent's cache on a real, small, full filesystem (a tmpfs in a private mount namespace).

The scenario (:mod:`tests.integration.full_disk`) runs in a child process of its own mount namespace
(``unshare -rm``), so that its tmpfs is seen by nothing else on the machine; the hub is a fake one in
that process. With every role a real process, the Node's condition and label: ``test_autonomy_e2e``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest

from tests.integration.tmpfs import on_tmpfs, usable

TMPFS_BYTES: Final = 1024 * 1024
"""Room for the store and the ledger with a few cached objects, and not for three 192 KiB Pods more."""


@pytest.fixture
def tmpfs_home(tmp_path: Path) -> Path:
    """A directory on which a child can mount a tmpfs of its own; skips where namespaces are not allowed."""
    usable(tmp_path)
    return tmp_path


def test_keys_errored_on_a_full_disk_survive_a_restart_and_are_repaired_once_space_is_freed(
    tmpfs_home: Path,
) -> None:
    """On a full tmpfs the Pods' writes fail and their keys are errored, persisted though the disk is
    full; the condition turns Unknown on the fourth failing check; the keys survive an agent restart on
    the still-full disk; once space is freed the repair loop fetches them, they are stored without any
    change in the cloud, and the condition is True again."""
    command = [*on_tmpfs(tmpfs_home, TMPFS_BYTES), sys.executable, "-m", "tests.integration.full_disk", str(tmpfs_home)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout)
    pods = ["Pod/default/web-0", "Pod/default/web-1", "Pod/default/web-2"]
    assert seen["first"] == "True"
    assert seen["filled_bytes"] > 0
    assert seen["errored"] == pods
    assert seen["persisted_while_full"] is True
    assert (seen["unknown"]["status"], seen["unknown"]["reason"]) == ("Unknown", "cache failed")
    assert seen["unknown"]["message"].count("is full: database or disk is full") == 3
    assert seen["failing_checks"] == 4
    assert seen["errored_after_restart"] == pods
    assert seen["requested_after_restart"] is True
    assert seen["fetched"] == pods
    assert seen["final"] == {"status": "True", "reason": "autonomy enabled successfully"}
    assert seen["errored_at_end"] == []
    assert seen["cached_at_end"] == ["small", "web-0", "web-1", "web-2"]
