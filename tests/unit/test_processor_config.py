"""The edge's ``diagnosis`` config section: closed by default, loaded from YAML, bad entries named at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from roles.config import ConfigError, EdgeConfig, load_config


def test_the_diagnosis_section_is_closed_by_default() -> None:
    """No scripts, no HTTP host but the device, no file readable by file.tail."""
    config = EdgeConfig().diagnosis
    assert not config.scripts.enabled
    assert not config.scripts.allow_any
    assert config.scripts.allowed_sha256 == ()
    assert config.http_hosts == ()
    assert config.tail_dirs == ()
    assert "diagnosis" not in EdgeConfig.UPDATABLE_FIELDS


def test_the_diagnosis_section_loads_from_the_config_file(tmp_path: Path) -> None:
    """Its camelCase keys, as the README shows them."""
    path = tmp_path / "edge.yaml"
    path.write_text(
        "diagnosis:\n"
        f"  scripts: {{enabled: true, allowedSha256: ['{'ab' * 32}'], maxOutputBytes: 4096}}\n"
        "  httpHosts: [metrics.local]\n"
        "  tailDirs: [/var/log]\n"
    )
    config = load_config("edge", path, {})
    assert isinstance(config, EdgeConfig)
    assert config.diagnosis.scripts.allowed_sha256 == ("ab" * 32,)
    assert config.diagnosis.scripts.max_output_bytes == 4096
    assert config.diagnosis.http_hosts == ("metrics.local",)
    assert config.diagnosis.tail_dirs == ("/var/log",)


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ("scripts: {allowedSha256: [abc]}", "diagnosis.scripts.allowedSha256: 'abc'"),
        ("scripts: {maxOutputBytes: 10}", "maxOutputBytes"),
        ("tailDirs: [var/log]", "diagnosis.tailDirs: 'var/log' is not an absolute path"),
        ("httpHosts: ['https://x']", "diagnosis.httpHosts: 'https://x'"),
        ("scripts: {enable: true}", "enable"),
    ],
)
def test_a_bad_diagnosis_entry_is_refused_at_start_naming_it(tmp_path: Path, section: str, named: str) -> None:
    """A typo fails the agent's start with the setting's name, never a silently open or closed door."""
    path = tmp_path / "edge.yaml"
    path.write_text(f"diagnosis: {{{section}}}\n")
    with pytest.raises(ConfigError) as raised:
        load_config("edge", path, {})
    assert named in str(raised.value)
