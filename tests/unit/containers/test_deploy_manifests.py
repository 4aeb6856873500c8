"""``containers/deploy/`` agrees with the code: the CRDs, the webhooks, the configs, the names, the probes.

(That the API server takes the manifests, and that the RBAC works, is
``tests/integration/test_deploy.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from roles.cli import certs
from roles.common.config import ControllerConfig, load_config
from roles.common.controller_config import in_pod_namespace
from roles.controller.admission.registration import webhook_configurations
from tools.provision import deploy_crds

DEPLOY = Path(__file__).resolve().parents[3] / "containers" / "deploy"


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def _one(name: str, kind: str, object_name: str) -> dict[str, Any]:
    (found,) = [d for d in _documents(name) if d["kind"] == kind and d["metadata"]["name"] == object_name]
    return found


def _role_config(role: str, tmp_path: Path) -> Any:
    config_map = _one(f"{role}.yaml", "ConfigMap", f"nodetaskd-{role}")
    path = tmp_path / f"{role}.yaml"
    path.write_text(config_map["data"][f"{role}.yaml"])
    return load_config(role, path, {})


def test_the_deployed_crds_are_the_generated_ones() -> None:
    """containers/deploy/crds holds exactly schemas/crds and a kustomization listing them (`just crds` syncs them)."""
    assert deploy_crds.differences() == []


def test_the_webhook_manifests_are_what_the_controller_registers_but_the_ca(tmp_path: Path) -> None:
    """What roles/controller/admission/registration.py builds for the Service, but the caBundle."""
    config = _role_config("controller", tmp_path)
    assert isinstance(config, ControllerConfig)
    config = in_pod_namespace(config, {"POD_NAMESPACE": certs.NAMESPACE})
    built = webhook_configurations(service=config.webhook_service_ref, ca_bundle=b"")
    for document, code in zip(_documents("webhooks.yaml"), built, strict=True):
        expected = msgspec.json.decode(msgspec.json.encode(code))
        for webhook in expected["webhooks"]:
            del webhook["clientConfig"]["caBundle"]  # set at start by every replica, from the shared Secret
            for rule in webhook["rules"]:
                rule.setdefault("scope", "*")
        manifest = {**document, "metadata": {"name": document["metadata"]["name"]}}  # labels aside
        assert manifest == expected


def test_the_configmaps_are_valid_role_configs_that_use_the_mounted_files(tmp_path: Path) -> None:
    """Both ConfigMaps load as their role's config; the files they name are where the Secrets are mounted."""
    controller = _role_config("controller", tmp_path)
    cloud = _role_config("cloud", tmp_path)
    assert isinstance(controller, ControllerConfig)
    in_pod = in_pod_namespace(controller, {"POD_NAMESPACE": certs.NAMESPACE})
    assert in_pod.webhook_service_ref == (certs.NAMESPACE, certs.WEBHOOK_SERVICE, 443)
    for role, config, secret in (("controller", controller, certs.WEBHOOK_SECRET), ("cloud", cloud, certs.HUB_SECRET)):
        pod = _one(f"{role}.yaml", "Deployment", f"nodetaskd-{role}")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == secret
        assert config.tls_cert_file == f"{mounts['tls']}/tls.crt"
        assert config.tls_key_file == f"{mounts['tls']}/tls.key"
        assert container["args"] == [f"--role={role}", f"--config={mounts['config']}/{role}.yaml"]
    assert controller.tls_ca_file == "/etc/nodetaskd/tls/ca.crt"


def test_probes_and_scrape_annotations_point_at_the_ports_the_configs_listen_on(tmp_path: Path) -> None:
    """Readiness on /readyz, liveness on /healthz, Prometheus on /metrics, each on the health port of the role."""
    health_ports = {
        "controller": _role_config("controller", tmp_path).metrics_port,
        "cloud": _role_config("cloud", tmp_path).http_address[1],
    }
    for role, port in health_ports.items():
        template = _one(f"{role}.yaml", "Deployment", f"nodetaskd-{role}")["spec"]["template"]
        (container,) = template["spec"]["containers"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports[container["readinessProbe"]["httpGet"]["port"]] == port
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert template["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        assert template["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


@pytest.mark.parametrize("role", ["controller", "cloud"])
def test_services_and_budgets_select_the_pods_and_the_pods_run_unprivileged(role: str) -> None:
    """Every Service and PodDisruptionBudget selects the Deployment's pods; they run as the image's user, read-only."""
    deployment = _one(f"{role}.yaml", "Deployment", f"nodetaskd-{role}")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for document in _documents(f"{role}.yaml"):
        selector = document.get("spec", {}).get("selector")
        if document["kind"] == "Service":
            assert selector.items() <= labels.items()
        elif document["kind"] in ("PodDisruptionBudget", "Deployment"):
            assert selector["matchLabels"].items() <= labels.items()
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"nodetaskd-{role}"
    assert (pod["securityContext"]["runAsNonRoot"], pod["securityContext"]["runAsUser"]) == (True, 65532)
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    resources = container["resources"]
    assert set(resources) == {"requests", "limits"}


def test_the_controller_runs_two_replicas_and_always_keeps_one() -> None:
    """Two replicas under one Lease; the budget keeps one serving the webhooks through a drain."""
    assert _one("controller.yaml", "Deployment", "nodetaskd-controller")["spec"]["replicas"] == 2
    assert _one("controller.yaml", "PodDisruptionBudget", "nodetaskd-controller")["spec"]["minAvailable"] == 1
    service = _one("cloud.yaml", "Service", "nodetaskd-cloud-headless")
    assert service["spec"]["clusterIP"] == "None"


def test_the_controller_is_scheduled_before_ordinary_workloads_by_a_class_the_manifests_define() -> None:
    """Its pods name the PriorityClass controller.yaml defines, above the default 0 and below system-* classes."""
    pod = _one("controller.yaml", "Deployment", "nodetaskd-controller")["spec"]["template"]["spec"]
    priority = _one("controller.yaml", "PriorityClass", pod["priorityClassName"])
    assert 0 < priority["value"] < 1_000_000_000
    assert priority["globalDefault"] is False


def test_no_config_names_the_namespace_so_a_namespace_overlay_moves_the_whole_install(tmp_path: Path) -> None:
    """The ConfigMaps' settings name no namespace of the install: the controller takes its own from the downward
    API (POD_NAMESPACE) for its Lease, its webhook Service and the hubs' ServiceAccount."""
    for role in ("controller", "cloud"):
        data = _one(f"{role}.yaml", "ConfigMap", f"nodetaskd-{role}")["data"]
        assert all(certs.NAMESPACE not in text for text in data.values()), role
    pod = _one("controller.yaml", "Deployment", "nodetaskd-controller")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["POD_NAMESPACE"] == "metadata.namespace"
    controller = in_pod_namespace(_role_config("controller", tmp_path), {"POD_NAMESPACE": "edge-ops"})
    assert controller.leader_namespace == "edge-ops"
    assert controller.webhook_service_ref[0] == "edge-ops"
    users = controller.node_certificates.hub_user_names(controller.own_namespace)
    assert users == {"system:serviceaccount:edge-ops:nodetaskd-cloud"}


def _pod_ports(role: str) -> tuple[dict[str, str], set[str]]:
    """The labels of ``role``'s pods and the names of their container ports."""
    template = _one(f"{role}.yaml", "Deployment", f"nodetaskd-{role}")["spec"]["template"]
    (container,) = template["spec"]["containers"]
    return template["metadata"]["labels"], {p["name"] for p in container["ports"]}


PUBLIC_PORTS = {"controller": {"webhook"}, "cloud": {"hub"}}
"""The ports called from outside the namespace's pods: the API server's webhook calls, the edges' sessions."""


def test_the_edges_service_publishes_the_hub_port_alone_and_metrics_have_cluster_ip_services() -> None:
    """The LoadBalancer carries 10004 only; health and metrics are reached through ClusterIP Services."""
    public = _one("cloud.yaml", "Service", "nodetaskd-cloud")
    assert public["spec"]["type"] == "LoadBalancer"
    assert [(p["name"], p["port"]) for p in public["spec"]["ports"]] == [("hub", 10004)]
    for role, port in (("controller", "metrics"), ("cloud", "http")):
        service = _one("metrics-services.yaml", "Service", f"nodetaskd-{role}-metrics")
        assert service["spec"].get("type", "ClusterIP") == "ClusterIP"
        assert [p["targetPort"] for p in service["spec"]["ports"]] == [port]
        assert service["spec"]["selector"].items() <= _pod_ports(role)[0].items()
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert {"metrics-services.yaml", "network-policies.yaml"} <= set(listed)


@pytest.mark.parametrize("role", ["controller", "cloud"])
def test_the_network_policy_admits_every_port_of_the_pods_and_only_the_public_ones_from_anywhere(role: str) -> None:
    """The policy selects the role's pods; each container port has a rule; the webhook and hub ports are open
    to any source, the health and metrics port to Prometheus pods alone."""
    policy = _one("network-policies.yaml", "NetworkPolicy", f"nodetaskd-{role}")
    labels, ports = _pod_ports(role)
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    open_ports: set[str] = set()
    guarded: set[str] = set()
    for rule in policy["spec"]["ingress"]:
        named = {p["port"] for p in rule["ports"]}
        assert named <= ports
        if "from" in rule:
            assert all(source["podSelector"]["matchLabels"] for source in rule["from"])
            guarded |= named
        else:
            open_ports |= named
    assert open_ports == PUBLIC_PORTS[role]
    assert guarded == ports - PUBLIC_PORTS[role]


def test_the_kubeedge_reports_component_publishes_the_report_port_and_opens_it_to_the_edges() -> None:
    """Only with the component does port 10002 get a LoadBalancer and a rule admitting any source."""
    component = DEPLOY / "kubeedge-reports"
    assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component"
    documents = [d for d in yaml.safe_load_all((component / "reports.yaml").read_text()) if d]
    (service,) = [d for d in documents if d["kind"] == "Service"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(10002, "http")]
    (policy,) = [d for d in documents if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "http"}]}]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= _pod_ports("cloud")[0].items()
