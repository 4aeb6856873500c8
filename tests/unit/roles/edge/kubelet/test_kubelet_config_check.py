"""A kubelet ConfigUpdateJob's Check on the device: off until the device names its kubelet and its file; the
allowlist and the value types enforced here too (a job stored while the webhook was away comes unchecked)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from flows.nodejobs import configupdatejob
from roles.edge.context import Outcome
from roles.edge.kubelet.config import _updated
from schemas.v1alpha2 import ConfigUpdateJobSpec, NodeComponent
from tests.unit.roles.edge.checks_run import run_check

KUBELET_CONFIG = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", "maxPods": 110}


def _config(home: Path, *, config_file: bool = True) -> Path:
    (home / "token").write_text("secret")
    kubelet_file = home / "kubelet.json"
    kubelet_file.write_text(json.dumps(KUBELET_CONFIG))
    kubelet = {"binary": "/usr/bin/kubelet", "restartCommand": ["true"]}
    if config_file:
        kubelet["configFile"] = str(kubelet_file)
    config = {"nodeName": "edge-1", "hubUrls": ["ws://127.0.0.1:1"], "tokenFile": str(home / "token")}
    path = home / "edge.yaml"
    path.write_bytes(msgspec.yaml.encode({**config, "kubelet": kubelet}))
    return path


async def _check(config: Path, fields: dict[str, str]) -> Outcome:
    spec = ConfigUpdateJobSpec(node_names=("edge-1",), update_fields=fields, component=NodeComponent.KUBELET)
    return await run_check(configupdatejob.JOB_TYPE, spec, config_file=config, data_dir=config.parent / "data")


async def test_a_kubelet_config_update_is_refused_until_the_device_names_the_kubelets_file(tmp_path: Path) -> None:
    """Without ``kubelet.configFile`` the Check fails naming it."""
    outcome = await _check(_config(tmp_path, config_file=False), {"maxPods": "42"})
    assert not outcome.succ
    assert "kubelet.binary and kubelet.configFile must both be set" in outcome.reason


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"address": "0.0.0.0"}, "updateFields refused: address is not a kubelet setting"),
        ({"maxPods": "many"}, "updateFields refused: maxPods must be an integer from 1 to 10000"),
        ({}, "updateFields is empty"),
    ],
)
async def test_the_agent_refuses_what_the_webhook_refuses(tmp_path: Path, fields: dict[str, str], reason: str) -> None:
    """A key outside the allowlist or a value of the wrong type fails Check, before anything is written."""
    config = _config(tmp_path)
    outcome = await _check(config, fields)
    assert not outcome.succ
    assert outcome.reason.startswith(reason), outcome.reason
    assert json.loads((tmp_path / "kubelet.json").read_text()) == KUBELET_CONFIG


async def test_an_allowed_field_passes_check_and_a_file_that_is_no_kubelet_configuration_does_not(
    tmp_path: Path,
) -> None:
    """The file is read (not written) at Check: a KubeletConfiguration passes, anything else is named."""
    config = _config(tmp_path)
    assert await _check(config, {"maxPods": "42"}) == Outcome(True)
    (tmp_path / "kubelet.json").write_text('{"kind": "Pod"}')
    refused = await _check(config, {"maxPods": "42"})
    assert (
        refused.reason
        == f"cannot apply updateFields to kubelet.configFile: {tmp_path / 'kubelet.json'} is not a KubeletConfiguration"
    )


def test_the_updated_file_keeps_its_format_and_every_other_setting(tmp_path: Path) -> None:
    """JSON stays JSON and YAML stays YAML; fields not set are kept; a field set is replaced whole."""
    as_json = tmp_path / "kubelet.json"
    as_json.write_text(json.dumps({**KUBELET_CONFIG, "evictionHard": {"memory.available": "1Mi"}}))
    updated = json.loads(_updated(as_json, {"maxPods": 42, "evictionHard": {"nodefs.available": "5%"}}))
    assert updated == {**KUBELET_CONFIG, "maxPods": 42, "evictionHard": {"nodefs.available": "5%"}}
    as_yaml = tmp_path / "kubelet.yaml"
    as_yaml.write_bytes(msgspec.yaml.encode(KUBELET_CONFIG))
    text = _updated(as_yaml, {"serializeImagePulls": False}).decode()
    assert not text.startswith("{")
    assert msgspec.yaml.decode(text) == {**KUBELET_CONFIG, "serializeImagePulls": False}
