"""A kubelet upgrade's Check on the device: off until the device's config names its kubelet, and no downgrade
unless the job allows one. The kubelet is an executable script answering ``--version`` as a kubelet does."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from flows.nodejobs import nodeupgradejob
from roles.common.config import ConfigError, load_config
from roles.edge.context import Outcome
from schemas.v1alpha2 import NodeComponent, NodeUpgradeJobSpec
from tests.unit.roles.edge.checks_run import run_check

RUNNING = "v1.20.3"


def _config(home: Path, **kubelet: object) -> Path:
    (home / "token").write_text("secret")
    config = {"nodeName": "edge-1", "hubUrls": ["ws://127.0.0.1:1"], "tokenFile": str(home / "token")}
    path = home / "edge.yaml"
    path.write_bytes(msgspec.yaml.encode({**config, **({"kubelet": kubelet} if kubelet else {})}))
    return path


def _kubelet(home: Path, says: str = f"Kubernetes {RUNNING}") -> Path:
    script = home / "kubelet"
    script.write_text(f'#!/bin/sh\n[ "$1" = --version ] && echo "{says}" && exit 0\nexit 1\n')
    script.chmod(0o755)
    return script


async def _check(config: Path, version: str, *, allow_downgrade: bool = False, image: str = "") -> Outcome:
    spec = NodeUpgradeJobSpec(
        version=version,
        node_names=("edge-1",),
        component=NodeComponent.KUBELET,
        allow_downgrade=allow_downgrade,
        image=image,
    )
    return await run_check(nodeupgradejob.JOB_TYPE, spec, config_file=config, data_dir=config.parent / "data")


async def test_a_kubelet_upgrade_is_refused_until_the_device_names_its_kubelet(tmp_path: Path) -> None:
    """With no ``kubelet.binary`` the Check fails naming that setting, even where the agent could upgrade itself."""
    outcome = await _check(_config(tmp_path), "v1.20.4")
    assert outcome == Outcome(
        False, "kubelet upgrades are off on this node: kubelet.binary is not set in its configuration"
    )


async def test_a_downgrade_is_refused_unless_the_job_allows_it(tmp_path: Path) -> None:
    """An older version fails naming ``spec.allowDowngrade``; with it, Check goes on to look for the artifact."""
    config = _config(tmp_path, binary=str(_kubelet(tmp_path)), restartCommand=["true"])
    refused = await _check(config, "v1.20.3-rc.1")
    assert refused == Outcome(
        False, "refusing to downgrade the kubelet from v1.20.3 to v1.20.3-rc.1: set spec.allowDowngrade"
    )
    allowed = await _check(config, "v1.20.3-rc.1", allow_downgrade=True)
    assert allowed == Outcome(
        False, "kubelet upgrades need kubelet.upgradeImage: the repository this node takes kubelets from"
    )


async def test_a_job_cannot_choose_where_the_kubelet_comes_from(tmp_path: Path) -> None:
    """``spec.image`` may repeat the device's ``kubelet.upgradeImage`` (any tag: the version replaces it), no more."""
    kubelet = _kubelet(tmp_path)
    config = _config(tmp_path, binary=str(kubelet), restartCommand=["true"], upgradeImage="127.0.0.1:1/ours/kubelet")
    refused = await _check(config, "v1.20.4", image="evil.example.com/kubelet")
    assert refused == Outcome(
        False,
        "spec.image 'evil.example.com/kubelet' is not this node's kubelet.upgradeImage '127.0.0.1:1/ours/kubelet'"
        " (its only source)",
    )
    repeated = await _check(config, "v1.20.4", image="127.0.0.1:1/ours/kubelet:latest")
    assert repeated.reason.startswith("upgrade artifact 127.0.0.1:1/ours/kubelet:v1.20.4: "), repeated


async def test_build_metadata_of_the_running_kubelet_has_no_say_in_the_order(tmp_path: Path) -> None:
    """``v1.20.3+k3s1`` runs: v1.20.4 goes on to its artifact, v1.20.3-rc.1 is a downgrade."""
    config = _config(tmp_path, binary=str(_kubelet(tmp_path, says="Kubernetes v1.20.3+k3s1")), restartCommand=["true"])
    newer = await _check(config, "v1.20.4")
    assert newer.reason.startswith("kubelet upgrades need kubelet.upgradeImage"), newer
    older = await _check(config, "v1.20.3-rc.1")
    assert older.reason.startswith("refusing to downgrade the kubelet from v1.20.3+k3s1 to v1.20.3-rc.1"), older


async def test_the_running_version_passes_check_with_nothing_to_fetch(tmp_path: Path) -> None:
    """A node already at the version (the controller's view was stale) passes Check without a registry."""
    config = _config(tmp_path, binary=str(_kubelet(tmp_path)), restartCommand=["true"])
    assert await _check(config, RUNNING) == Outcome(True)


@pytest.mark.parametrize("says", ["hello", "Kubernetes v1.20.3/../../etc", "Kubernetes 1.20.3"])
async def test_a_binary_that_is_no_kubelet_is_named(tmp_path: Path, says: str) -> None:
    """What ``--version`` printed is quoted when it is not ``Kubernetes v<version>`` (no path in it either)."""
    config = _config(tmp_path, binary=str(_kubelet(tmp_path, says=says)), restartCommand=["true"])
    outcome = await _check(config, "v1.20.4")
    assert not outcome.succ
    assert outcome.reason == f"{tmp_path / 'kubelet'} --version exited 0 saying {says!r}, not 'Kubernetes <version>'"


@pytest.mark.parametrize(
    ("kubelet", "problem"),
    [
        ({"binary": "kubelet", "restartCommand": ["true"]}, "kubelet.binary 'kubelet' is not an absolute path"),
        ({"binary": "/usr/bin/kubelet"}, "kubelet.restartCommand is empty"),
        ({"healthzUrl": "127.0.0.1:10248"}, "kubelet.healthzUrl '127.0.0.1:10248' is not an http(s) URL"),
        ({"bianry": "/usr/bin/kubelet"}, "bianry"),
    ],
)
def test_a_kubelet_setting_that_cannot_work_is_refused_at_load(
    tmp_path: Path, kubelet: dict[str, object], problem: str
) -> None:
    """The agent does not start with a kubelet block it could not act on; the error names the key."""
    with pytest.raises(ConfigError, match=problem.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_config("edge", _config(tmp_path, **kubelet), {})
