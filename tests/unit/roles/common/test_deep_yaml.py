"""Deeply nested YAML (role configs, job manifests) is refused with a clear error, never a crash.

libyaml's composer recurses in C, so before the limit such a file took the interpreter down with a
segfault: each case runs in its own process, which a regression kills instead of the test run.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEEP_YAML = "nodeName: " + "[" * 100_000 + "]" * 100_000 + "\n"


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, check=False)


def test_a_config_nested_too_deeply_exits_2_naming_the_limit_and_the_line(tmp_path: Path) -> None:
    """nodetaskd with a config nested 100,000 deep exits 2 with one line naming the file, the limit and where."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(DEEP_YAML)
    done = subprocess.run(
        [sys.executable, "-m", "roles.cli", "--role=edge", f"--config={cfg}", "--check-config"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"nodetaskd: error: config {cfg}: nested too deeply: more than 64 levels of arrays and objects"
        " at line 1, column 74\n"
    )


def test_a_config_update_on_a_config_nested_too_deeply_is_refused(tmp_path: Path) -> None:
    """A config update finding the agent's file nested too deeply refuses with the reason instead of crashing."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(DEEP_YAML)
    code = (
        "import sys, types; from pathlib import Path; from roles.edge.config_update.config_update import candidate; "
        "spec = types.SimpleNamespace(update_fields={'maxCpuUsage': '90'}); "
        "print(candidate(types.SimpleNamespace(config_file=Path(sys.argv[1]), spec=spec))[1])"
    )
    done = _python(code, str(cfg))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("cannot apply updateFields: nested too deeply: more than 64 levels")


def test_a_job_manifest_nested_too_deeply_is_a_manifest_error(tmp_path: Path) -> None:
    """A YAML or JSON job manifest nested 100,000 deep is a ManifestError naming the limit."""
    code = (
        "import sys; from schemas.manifest import ManifestError, decode_job\n"
        "for fmt, doc in (('yaml', 'spec: ' + '[' * 100_000), ('json', '{\"spec\": ' + '[' * 100_000)):\n"
        "    try:\n"
        "        decode_job(doc, fmt=fmt)\n"
        "    except ManifestError as exc:\n"
        "        print(fmt, exc)\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "yaml invalid node job: nested too deeply: more than 64 levels of arrays and objects at line 1, column 70",
        "json invalid node job: nested too deeply: more than 64 levels of arrays and objects",
    ]
