"""``nodetaskd completion bash`` is a script real bash completes the commands, options and values with."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

COMPLETE = """
source "$1"
read -ra COMP_WORDS <<< "$2"
[[ "$2" == *" " ]] && COMP_WORDS+=("")
COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
COMP_LINE="$2"
COMP_POINT=${#2}
_shtab_nodetaskd
printf '%s\\n' "${COMPREPLY[@]}"
"""
"""Bash's completion of the line in $2 with the script in $1, as a TAB at its end asks for it."""


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    command = [sys.executable, "-m", "roles.cli", "completion", "bash"]
    made = subprocess.run(command, capture_output=True, text=True, check=True, timeout=60)
    path = tmp_path_factory.mktemp("completion") / "nodetaskd.bash"
    path.write_text(made.stdout)
    return path


def _complete(script: Path, line: str, cwd: Path | None = None) -> list[str]:
    done = subprocess.run(
        ["bash", "-c", COMPLETE, "bash", str(script), line],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=cwd,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("nodetaskd ctl g", ["get"]),
        ("nodetaskd c", ["certs", "completion", "ctl"]),
        ("nodetaskd --ro", ["--role"]),
        ("nodetaskd --role ", ["cloud", "cloudhub", "controller", "edge"]),
        ("nodetaskd ctl describe --ph", ["--phase"]),
        ("nodetaskd edge join --no", ["--no-hub-check", "--node"]),
        ("nodetaskd completion ", ["bash", "zsh", "tcsh"]),
    ],
)
def test_bash_completes_commands_options_and_choices(script: Path, line: str, expected: list[str]) -> None:
    """Commands, roles' and commands' options, and the values an option takes, each from the parsers."""
    assert sorted(_complete(script, line)) == sorted(expected)


def test_bash_completes_the_namespace_flag_of_ctl_get_and_paths_for_path_options(script: Path, tmp_path: Path) -> None:
    """ctl get offers -n and -A; --token-file offers the files, --root the directories, where the shell stands."""
    assert {"-n", "--namespace", "-A", "--all-namespaces", "-l", "--no-headers"} <= set(
        _complete(script, "nodetaskd ctl get -")
    )
    (tmp_path / "edge-1.token").write_text("t")
    (tmp_path / "edge-root").mkdir()
    assert _complete(script, "nodetaskd edge join --token-file edge-1", cwd=tmp_path) == ["edge-1.token"]
    assert _complete(script, "nodetaskd edge join --root edge-", cwd=tmp_path) == ["edge-root"]
