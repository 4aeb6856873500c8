"""Where the controller's webhook listens, and the caps of its two ports as settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from roles.common.config import ConfigError, ControllerConfig, load_config
from roles.controller.admission.webhook_server import POD_IP_ENV, webhook_host

DEPLOYMENT = Path(__file__).resolve().parents[5] / "containers" / "deploy" / "controller.yaml"


def _controller(**options: object) -> ControllerConfig:
    cfg = load_config("controller", None, options)
    assert isinstance(cfg, ControllerConfig)
    return cfg


def test_the_webhook_listens_on_the_pods_ip_else_on_listen_host() -> None:
    """webhookHost wins; without it, the pod's IP from the environment; outside Kubernetes, listenHost."""
    assert webhook_host(_controller(), {POD_IP_ENV: "10.244.1.7"}) == "10.244.1.7"
    assert webhook_host(_controller(webhookHost="10.0.0.1"), {POD_IP_ENV: "10.244.1.7"}) == "10.0.0.1"
    assert webhook_host(_controller(listenHost="127.0.0.1"), {}) == "127.0.0.1"
    assert webhook_host(_controller(), {POD_IP_ENV: ""}) == "0.0.0.0"  # listenHost default, for local runs


def test_the_deployment_gives_the_controller_its_pod_ip() -> None:
    """containers/deploy sets the variable the webhook's address is read from, from the pod's status."""
    documents = [d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d]
    (deployment,) = [d for d in documents if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env: list[dict[str, Any]] = container["env"]
    assert {"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in env
    (config_map,) = [d for d in documents if d["kind"] == "ConfigMap"]
    assert "webhookHost" not in yaml.safe_load(config_map["data"]["controller.yaml"])


@pytest.mark.parametrize("port", ["webhook", "metrics"])
def test_a_peers_share_larger_than_the_total_is_refused_naming_both_settings(port: str) -> None:
    """A per-peer cap above the total would never apply: the configuration is refused saying which two settings."""
    with pytest.raises(ConfigError, match=f"{port}MaxConnectionsPerPeer must not be more than {port}MaxConnections"):
        _controller(**{f"{port}MaxConnections": 4, f"{port}MaxConnectionsPerPeer": 5})


def test_the_webhook_body_limit_takes_two_objects_of_etcds_size() -> None:
    """The default review limit fits an UPDATE of an object at etcd's 1.5 MiB limit (object and oldObject)."""
    assert ControllerConfig().webhook_max_body_bytes >= 2 * (3 << 19)
    with pytest.raises(ConfigError, match="webhookMaxBodyBytes"):
        _controller(webhookMaxBodyBytes=1000)
