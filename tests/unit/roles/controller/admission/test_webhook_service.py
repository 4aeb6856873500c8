"""In a cluster, the webhooks are registered through a Service, with the CA of a certificate every replica shares."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from roles.common.config import ConfigError, ControllerConfig, load_config
from roles.common.controller_config import in_pod_namespace
from roles.common.tls import generate_serving_certificate
from roles.controller.admission.registration import webhook_configurations
from roles.controller.admission.reviews import MUTATE_PATH, VALIDATE_PATH
from roles.controller.admission.webhook_server import serving_certificate

MOUNTED = {"tlsCertFile": "/tls/tls.crt", "tlsKeyFile": "/tls/tls.key", "tlsCaFile": "/tls/ca.crt"}


def _controller(**options: object) -> ControllerConfig:
    cfg = load_config("controller", None, options)
    assert isinstance(cfg, ControllerConfig)
    return cfg


def test_webhook_service_is_read_as_namespace_name_and_port() -> None:
    """``namespace/name[:port]`` gives the Service reference; the port defaults to 443."""
    assert _controller(webhookService="nodetaskd-system/nodetaskd-webhook", **MOUNTED).webhook_service_ref == (
        "nodetaskd-system",
        "nodetaskd-webhook",
        443,
    )
    assert _controller(webhookService="ns/svc:8443", **MOUNTED).webhook_service_ref == ("ns", "svc", 8443)


def test_a_webhook_service_without_a_namespace_is_in_the_controllers_own() -> None:
    """``name[:port]`` is in the controller's ``namespace``: the pod's (``POD_NAMESPACE``), else kube-system."""
    alone = _controller(webhookService="nodetaskd-webhook:443", **MOUNTED)
    assert alone.webhook_service_ref == ("kube-system", "nodetaskd-webhook", 443)
    in_pod = in_pod_namespace(alone, {"POD_NAMESPACE": "edge-ops"})
    assert in_pod.webhook_service_ref == ("edge-ops", "nodetaskd-webhook", 443)
    assert (in_pod.leader_namespace, alone.leader_namespace) == ("edge-ops", "kube-system")
    named = _controller(namespace="ops", leaseNamespace="leases", webhookService="svc", **MOUNTED)
    assert in_pod_namespace(named, {"POD_NAMESPACE": "edge-ops"}) == named  # the config's word wins
    assert (named.webhook_service_ref[0], named.leader_namespace) == ("ops", "leases")
    with pytest.raises(ValueError, match="POD_NAMESPACE 'Edge_Ops' is not a namespace name"):
        in_pod_namespace(alone, {"POD_NAMESPACE": "Edge_Ops"})


def test_hub_service_accounts_are_users_in_the_controllers_namespace_unless_they_name_theirs() -> None:
    """``hubServiceAccounts`` become ServiceAccount user names beside ``hubUsers``, and turn the approver on."""
    cfg = _controller(
        nodeCertificates={
            "hubServiceAccounts": ["nodetaskd-cloud", "other/hub"],
            "hubUsers": ["alice"],
            "hubGroups": [],
        }
    )
    certificates = cfg.node_certificates
    assert certificates.enabled
    assert certificates.hub_user_names("edge-ops") == {
        "alice", "system:serviceaccount:edge-ops:nodetaskd-cloud", "system:serviceaccount:other:hub",
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"hubServiceAccounts: 'a/b/c' is not \[namespace/\]name"):
        _controller(nodeCertificates={"hubServiceAccounts": ["a/b/c"]})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"webhookService": "ns/svc"}, "webhookService needs tlsCertFile, tlsKeyFile and tlsCaFile"),
        (
            {"webhookService": "ns/svc", "tlsCertFile": "/c", "tlsKeyFile": "/k"},
            "webhookService needs tlsCertFile, tlsKeyFile and tlsCaFile",
        ),
        ({"webhookService": "a/b/c", **MOUNTED}, "webhookService 'a/b/c' is not [namespace/]name[:port]"),
        ({"webhookService": "ns/Svc", **MOUNTED}, "is not [namespace/]name[:port]"),
        ({"webhookService": "ns/svc:0", **MOUNTED}, "port '0' is not within 1-65535"),
        (
            {"webhookService": "ns/svc", "webhookUrl": "https://127.0.0.1:9443", **MOUNTED},
            "webhookUrl and webhookService exclude each other",
        ),
    ],
)
def test_a_webhook_service_without_a_shared_certificate_or_malformed_is_refused(
    options: dict[str, object], message: str
) -> None:
    """The controller refuses to generate its own CA for a Service many replicas stand behind, naming the settings."""
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _controller(**options)


def test_service_configurations_name_the_service_and_the_paths() -> None:
    """Both configurations call the Service at the webhook paths, with the CA bundle given, and no URL."""
    validating, mutating = webhook_configurations(service=("ns", "svc", 443), ca_bundle=b"PEM")
    for config, path in ((validating, VALIDATE_PATH), (mutating, MUTATE_PATH)):
        (webhook,) = config.webhooks
        wire = msgspec.to_builtins(webhook.client_config)
        assert wire == {"caBundle": "UEVN", "service": {"namespace": "ns", "name": "svc", "path": path, "port": 443}}


def test_url_and_service_together_or_neither_is_an_error() -> None:
    """A webhook has one address: asking for both, or none, is refused."""
    with pytest.raises(ValueError, match="exactly one of url_base and service"):
        webhook_configurations(url_base="https://x", service=("ns", "svc", 443), ca_bundle=b"")
    with pytest.raises(ValueError, match="exactly one of url_base and service"):
        webhook_configurations(ca_bundle=b"")


def test_every_replica_mounting_the_same_secret_registers_the_same_configurations(tmp_path: Path) -> None:
    """Two replicas loading one mounted certificate produce identical configurations: nothing to fight over."""
    generate_serving_certificate(tmp_path, dns_names=["nodetaskd-webhook.ns.svc"])
    files = {"tlsCertFile": "tls.crt", "tlsKeyFile": "tls.key", "tlsCaFile": "ca.crt"}
    cfg = _controller(webhookService="ns/nodetaskd-webhook", **{k: str(tmp_path / v) for k, v in files.items()})
    registered = []
    for _replica in range(2):
        cert = serving_certificate(cfg)
        assert cert.ca_bundle == (tmp_path / "ca.crt").read_bytes()
        registered.append(
            msgspec.json.encode(webhook_configurations(service=cfg.webhook_service_ref, ca_bundle=cert.ca_bundle))
        )
    assert registered[0] == registered[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]  # nothing generated
