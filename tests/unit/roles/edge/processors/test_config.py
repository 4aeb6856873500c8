"""The edge's ``diagnosis`` config section: closed by default, loaded from YAML, bad entries named at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from roles.common.config import ConfigError, EdgeConfig, load_config
from roles.edge.settings import settings_of


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
    """Its camelCase keys, as docs/decisions.md shows them."""
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


def test_a_devices_limits_on_tasks_load_into_the_agents_settings(tmp_path: Path) -> None:
    """``diagnosis.maxConcurrentTasks``, ``diagnosis.maxRequestBytes``, ``storeQuotaBytes``, ``reconnectMaxDelay``
    ``autonomy.checkPeriod`` and ``handshakeTimeout`` reach the agent; left out, they are 4 Tasks, 128 KiB,
    64 MiB, 30 s, 10 s and 30 s."""
    (tmp_path / "token").write_text("t0ken")
    base = f"nodeName: edge-1\nhubUrls: [ws://hub.test]\ntokenFile: {tmp_path / 'token'}\n"
    path = tmp_path / "edge.yaml"
    path.write_text(base)
    defaults = load_config("edge", path, {})
    assert isinstance(defaults, EdgeConfig)
    limits = settings_of(defaults)
    assert (limits.max_concurrent_tasks, limits.max_request_bytes, limits.store_quota_bytes) == (4, 128 << 10, 64 << 20)
    assert (limits.reconnect_cap, limits.check_period, limits.handshake_timeout) == (30.0, 10.0, 30.0)
    path.write_text(
        base + "storeQuotaBytes: 2097152\nreconnectMaxDelay: 5\nhandshakeTimeout: 8\n"
        "diagnosis: {maxConcurrentTasks: 1, maxRequestBytes: 4096}\nautonomy: {checkPeriod: 2}\n"
    )
    config = load_config("edge", path, {})
    assert isinstance(config, EdgeConfig)
    settings = settings_of(config)
    assert (settings.max_concurrent_tasks, settings.max_request_bytes, settings.store_quota_bytes) == (1, 4096, 2 << 20)
    assert (settings.reconnect_cap, settings.check_period, settings.handshake_timeout) == (5.0, 2.0, 8.0)


@pytest.mark.parametrize(
    ("entry", "named"),
    [
        ("diagnosis: {maxConcurrentTasks: 0}", "Expected `int` >= 1 - at `$.diagnosis.maxConcurrentTasks`"),
        ("diagnosis: {maxRequestBytes: 1048576}", "Expected `int` <= 786432 - at `$.diagnosis.maxRequestBytes`"),
        ("storeQuotaBytes: 4096", "Expected `int` >= 1048576 - at `$.storeQuotaBytes`"),
        ("reconnectMaxDelay: 0.5", "Expected `float` >= 1.0 - at `$.reconnectMaxDelay`"),
        ("autonomy: {checkPeriod: 0.1}", "Expected `float` >= 1.0 - at `$.autonomy.checkPeriod`"),
        ("handshakeTimeout: 0", "Expected `float` >= 1.0 - at `$.handshakeTimeout`"),
    ],
)
def test_a_devices_limit_out_of_range_is_refused_at_start_naming_it(tmp_path: Path, entry: str, named: str) -> None:
    """No Task at a time, more request data than a hub sends, or a quota under 1 MiB: the start fails naming it."""
    path = tmp_path / "edge.yaml"
    path.write_text(entry + "\n")
    with pytest.raises(ConfigError) as raised:
        load_config("edge", path, {})
    assert named in str(raised.value)
