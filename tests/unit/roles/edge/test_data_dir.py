"""The agent makes its data directory its own (0700) at every start."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
import structlog
from structlog.testing import capture_logs

from roles.cli.main import main
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


def test_a_mount_point_left_1777_is_made_0700(tmp_path: Path) -> None:
    """A filesystem mounted as the data directory (a tmpfs starts out 1777) becomes the agent's alone too."""
    mounted = tmp_path / "data"
    mounted.mkdir()
    mounted.chmod(0o1777)
    private_data_dir(mounted, structlog.get_logger())
    assert _mode(mounted) == 0o700


def test_a_data_directory_that_cannot_be_created_ends_the_agent_naming_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Through the real entry point: one line on stderr naming dataDir and why, exit status 2."""
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory\n")
    token = tmp_path / "token"
    token.write_text("0P2JxTsk7bWk4iJx1qkJd5Ql2m6vyUeXv2VYg8TnQ-E\n")
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"nodeName: e1\nhubUrls: [ws://127.0.0.1:1]\ntokenFile: {token}\ndataDir: {blocked / 'data'}\n")
    try:
        assert main(["--role=edge", f"--config={cfg}"]) == 2
    finally:
        structlog.reset_defaults()
    said = f"nodetaskd: error: cannot make dataDir {blocked / 'data'} the agent's alone (0700): Not a directory\n"
    assert capsys.readouterr().err == said
