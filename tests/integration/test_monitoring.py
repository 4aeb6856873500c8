"""``containers/deploy/monitoring``: its ServiceMonitors find the roles' metrics ports, and its alerts and dashboard
ask only for metrics a real controller and hub serve."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from tests.integration.controlplane import ControlPlane
from tests.integration.processes import fleet

pytestmark = [pytest.mark.integration]
REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "containers" / "deploy" / "monitoring"
OVERLAY = Path(__file__).resolve().parent / "monitoring-overlay"
NAMESPACE = "nodetaskd-watched"
SUFFIXES = ("_total", "_created", "_bucket", "_sum", "_count")
NAME = re.compile(r"\b((?:nodetaskd|process)_[a-z_]+)\b")


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def test_each_service_monitor_scrapes_one_metrics_service_of_its_role(control_plane: ControlPlane) -> None:
    """Rendered into another namespace, each ServiceMonitor selects exactly one Service, a ClusterIP one whose
    port it names and whose pods are its role's; the public Services are not scraped."""
    rendered = [d for d in yaml.safe_load_all(control_plane.kubectl("kustomize", str(OVERLAY)).stdout) if d]
    services = [d for d in rendered if d["kind"] == "Service"]
    monitors = [d for d in rendered if d["kind"] == "ServiceMonitor"]
    assert {d["metadata"]["namespace"] for d in [*services, *monitors]} == {NAMESPACE}
    assert {m["metadata"]["name"] for m in monitors} == {"nodetaskd-controller", "nodetaskd-cloud"}
    for monitor in monitors:
        spec = monitor["spec"]
        (service,) = [s for s in services if _matches(spec["selector"]["matchLabels"], s["metadata"]["labels"])]
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
        (endpoint,) = spec["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == monitor["metadata"]["name"].split("-")[1]
    (rule,) = [d for d in rendered if d["kind"] == "PrometheusRule"]
    assert rule["metadata"]["namespace"] == NAMESPACE
    (dashboard,) = [d for d in rendered if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "nodetaskd-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["nodetaskd.json"])["uid"] == "nodetaskd"


def _exprs() -> list[str]:
    rule = yaml.safe_load((MONITORING / "prometheus-rule.yaml").read_text())
    exprs = [str(r["expr"]) for group in rule["spec"]["groups"] for r in group["rules"]]
    dashboard = json.loads((MONITORING / "dashboard.json").read_text())
    return exprs + [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]


def _families(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


def _family(name: str, families: set[str]) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return name


async def test_the_alerts_and_the_dashboard_ask_only_for_metrics_the_roles_serve(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """Every metric an alert or a dashboard panel names is one a running controller's or hub's /metrics has."""
    async with fleet(crds, tmp_path, edges=1, hubs=1) as running:
        controller: Any = msgspec.yaml.decode(running.controller.config.read_bytes())
        hub: Any = msgspec.yaml.decode(running.hubs[0].config.read_bytes())
        served = _families(f"http://127.0.0.1:{controller['metricsPort']}/metrics")
        served |= _families(f"http://{hub['httpListen']}/metrics")
    named = {match for expr in _exprs() for match in NAME.findall(expr)}
    assert len(named) >= 10, named
    missing = sorted(name for name in named if _family(name, served) not in served)
    assert missing == [], f"not served: {missing}"
