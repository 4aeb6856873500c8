"""The agent makes its data directory its own (0700) at every start, and refuses a shared one."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from roles.cli import main
from roles.config import ConfigError
from roles.edge.role import private_data_dir


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_data_directory_others_can_read_is_made_0700_and_logged(tmp_path: Path) -> None:
    """A directory left 0755 (made by hand, or by an older install) is the agent's alone after start."""
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    data_dir.chmod(0o755)
    with capture_logs() as logs:
        private_data_dir(data_dir, structlog.get_logger())
    assert _mode(data_dir) == 0o700
    assert [(e["event"], e["mode"]) for e in logs] == [("data_dir_made_private", "755")]


def test_a_missing_data_directory_is_created_0700_and_a_private_one_left_alone(tmp_path: Path) -> None:
    """A new directory is created private; one already 0700 is not touched, nor logged."""
    data_dir = tmp_path / "a" / "data"
    with capture_logs() as logs:
        private_data_dir(data_dir, structlog.get_logger())
        private_data_dir(data_dir, structlog.get_logger())
    assert _mode(data_dir) == 0o700
    assert logs == []


def test_a_shared_data_directory_is_refused_and_kept_as_it_is(tmp_path: Path) -> None:
    """Making /tmp (1777) 0700 would take it from everyone else: the agent refuses it, naming dataDir."""
    shared = tmp_path / "tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    with pytest.raises(ConfigError, match=rf"dataDir {shared} is shared \(mode 1777"):
        private_data_dir(shared, structlog.get_logger())
    assert _mode(shared) == 0o1777


def test_the_agent_started_on_a_shared_data_directory_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the real entry point: one line on stderr naming dataDir, exit status 2, nothing changed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    token = tmp_path / "token"
    token.write_text("0P2JxTsk7bWk4iJx1qkJd5Ql2m6vyUeXv2VYg8TnQ-E\n")
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"nodeName: e1\nhubUrls: [ws://127.0.0.1:1]\ntokenFile: {token}\ndataDir: {shared}\n")
    try:
        assert main(["--role=edge", f"--config={cfg}"]) == 2
    finally:
        structlog.reset_defaults()
    assert capsys.readouterr().err.startswith(f"nodetaskd: error: dataDir {shared} is shared (mode 1777")
    assert _mode(shared) == 0o1777
