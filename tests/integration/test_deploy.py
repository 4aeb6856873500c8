"""``containers/deploy/`` applied to a control plane of its own, and the roles run as its ServiceAccounts.

The local control plane has no kubelet and no scheduler: the Deployments are created, their Pods
never run. What can be checked here is: the server accepts every object (a server-side dry run,
then for real), each ServiceAccount's RBAC allows what its role does and refuses what it must not
(``kubectl auth can-i --as``), and the two roles, run as processes with those ServiceAccounts'
tokens, the Deployments' ConfigMaps and the Secrets ``nodetaskd certs create`` made, do their work:
two controller replicas register the Service-based webhooks with the one shared CA and serve the
certificate the API server would check, and a hub becomes ready; with the webhook Service's Endpoints
naming the controller process (as they would its pod), a job goes through the Service-based webhooks and
completes on a hub and an edge. The tests' kube-apiserver (1.20)
predates policy/v1, so the manifests go in through ``deploy-k8s-1.20/``, which only changes the
PodDisruptionBudgets' apiVersion.
"""

from __future__ import annotations

import base64
import functools
import ipaddress
import json
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import msgspec
import psutil
import pytest
import yaml

from roles.controller.admission.registration import VALIDATING_WEBHOOK_NAME
from schemas.kinds import GROUP
from tests.integration.fleet import register_edges
from tests.integration.hubs import light_edge, running_edges
from tests.integration.processes import RoleProcess
from tools.ports import free_ports
from tools.processes import answers_ok
from tools.provision.controlplane import ControlPlane, ensure_binaries, start

pytestmark = [pytest.mark.integration, pytest.mark.slow(130)]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "containers" / "deploy"
OVERLAY = Path(__file__).resolve().parent / "deploy-k8s-1.20"
NAMESPACE = "nodetaskd-elsewhere"
"""Where ``deploy-k8s-1.20/`` puts the install: not the base's ``nodetaskd-system``, as an operator's overlay may."""
CONTROLLER_SA = f"system:serviceaccount:{NAMESPACE}:nodetaskd-controller"
CLOUD_SA = f"system:serviceaccount:{NAMESPACE}:nodetaskd-cloud"
WEBHOOK_HOST = f"nodetaskd-webhook.{NAMESPACE}.svc"
OTHERS = ("kube-system", "default")
"""Namespaces whose Leases are other components' (kube-system: the scheduler's and controller-manager's)."""
OTHER = "another-product"
CSRS = "certificatesigningrequests.certificates.k8s.io"
SIGNERS = "signers.certificates.k8s.io/"
KUBELET_SIGNER = f"{SIGNERS}kubernetes.io/kube-apiserver-client-kubelet"
"""A webhook configuration that is not nodetaskd's."""


@dataclass(frozen=True)
class Deployed:
    cp: ControlPlane
    home: Path
    expected: frozenset[str]
    """``kind/name`` of every object the overlay renders (kubectl's lower-case resource names)."""
    dry_run: str
    created_before_apply: bool
    hub_ca: Path


def _objects(rendered: str) -> frozenset[str]:
    documents = [d for d in yaml.safe_load_all(rendered) if d]
    return frozenset(f"{d['kind'].lower()}/{d['metadata']['name']}" for d in documents)


def _nodetaskd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "roles.cli", *args], capture_output=True, text=True, timeout=120, check=False, cwd=cwd
    )


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """A fresh control plane (never the session's: these webhooks would refuse its jobs) with the
    deployment dry-run, then applied, and the Secrets made by ``nodetaskd certs create``."""
    home = tmp_path_factory.mktemp("deploy")
    cp = start(home / "cluster", ensure_binaries())
    try:
        rendered = cp.kubectl("kustomize", str(OVERLAY)).stdout
        # A dry run cannot create the namespace the other objects go into: it exists first, as it would
        # after a first install.
        cp.kubectl("create", "namespace", NAMESPACE)
        dry_run = cp.kubectl("apply", "--dry-run=server", "-k", str(OVERLAY)).stdout
        probe = cp.kubectl("-n", NAMESPACE, "get", "deployment", "nodetaskd-controller", check=False)
        cp.kubectl("apply", "-k", str(OVERLAY))
        cp.kubectl("wait", "--for=condition=established", "--timeout=60s", "crd", "--all")
        made = _nodetaskd(
            "certs",
            "create",
            f"--kubeconfig={cp.kubeconfig('admin')}",
            f"--namespace={NAMESPACE}",
            "--hub-host=127.0.0.1",
            f"--ca-out={home / 'hub-ca.crt'}",
            cwd=REPO,
        )
        assert made.returncode == 0, made.stderr
        yield Deployed(
            cp=cp,
            home=home,
            expected=_objects(rendered),
            dry_run=dry_run,
            created_before_apply=probe.returncode == 0,
            hub_ca=home / "hub-ca.crt",
        )
    finally:
        cp.stop()


def test_a_server_side_dry_run_accepts_every_object_and_creates_none(deployed: Deployed) -> None:
    """`kubectl apply --dry-run=server -k` passes every object through the API server's validation, creating nothing."""
    lines = [line for line in deployed.dry_run.splitlines() if line]
    assert len(lines) == len(deployed.expected) == 40
    assert all(line.endswith("(server dry run)") for line in lines), lines
    assert not deployed.created_before_apply


def test_applying_creates_every_object(deployed: Deployed) -> None:
    """After `kubectl apply -k`, each object the kustomization renders exists in the cluster."""
    found = deployed.cp.kubectl("get", "-k", str(OVERLAY), "-o", "name").stdout.split()
    # kubectl names them resource.group/name: keep the resource and the name.
    kinds_and_names = {f"{n.split('/')[0].split('.')[0]}/{n.split('/', 1)[1]}" for n in found}
    assert kinds_and_names == set(deployed.expected)
    deployments = json.loads(deployed.cp.kubectl("-n", NAMESPACE, "get", "deployments", "-o", "json").stdout)
    replicas = {d["metadata"]["name"]: d["spec"]["replicas"] for d in deployments["items"]}
    assert replicas == {"nodetaskd-controller": 2, "nodetaskd-cloud": 2}


# What each role needs (one line per kind of access its code uses), and what it must not be able to do.
ALLOWED = {
    CONTROLLER_SA: [
        "patch nodeupgradejobs.operations.kubeedge.io",
        "update imageprepulljobs.operations.kubeedge.io --subresource=status",
        "update configupdatejobs.operations.kubeedge.io --subresource=finalizers",
        "watch nodes",
        "create tasks.diagnosis.kubediag.org -n default",
        "patch diagnoses.diagnosis.kubediag.org --subresource=status -n default",
        "list pods -n default",
        "watch pods",
        "patch pods -n default",
        "watch namespaces",  # which namespaces opt in to the toleration binding
        "patch nodes",
        "create events -n default",
        f"update leases.coordination.k8s.io -n {NAMESPACE}",
        "patch validatingwebhookconfigurations.admissionregistration.k8s.io/nodetaskd",
        f"watch {CSRS}",  # the approver of the edges' node certificates
        f"update {CSRS} --subresource=approval",
        f"approve {KUBELET_SIGNER}",
        "get secrets -n kube-system",  # whether a node has a join token (its metadata only is asked for)
    ],
    CLOUD_SA: [
        "watch nodeupgradejobs.operations.kubeedge.io",
        "update imageprepulljobs.operations.kubeedge.io --subresource=status",
        "patch nodes",
        "create events -n default",
        "get secrets -n kube-system",
        "watch secrets -n kube-system",
        "watch tasks.diagnosis.kubediag.org --all-namespaces",
        "list tasks.diagnosis.kubediag.org --all-namespaces",
        "update tasks.diagnosis.kubediag.org --subresource=status -n default",
        "watch operations.diagnosis.kubediag.org",
        "get operations.diagnosis.kubediag.org",
        "get diagnoses.diagnosis.kubediag.org -n default",  # a Diagnosis's parameters, for its Tasks
        "watch pods",  # cache streams: one watch per kind, lists by field selector
        "list pods -n default",
        "watch configmaps",
        "list configmaps -n default",
        "patch nodes --subresource=status",  # the Autonomy condition
        f"create {CSRS}",  # a device's node certificate, for its session's node
        f"get {CSRS}",
    ],
}
REFUSED = {
    CONTROLLER_SA: [
        "get secrets -n default",  # Secrets only in the edges' tokenNamespace, one by one
        "list secrets -n kube-system",
        f"create {CSRS}",  # it approves what the hubs ask for, never asks itself
        f"delete {CSRS}",
        f"update {CSRS} --subresource=status",  # signing is kube-controller-manager's
        f"approve {SIGNERS}kubernetes.io/kube-apiserver-client",  # no other signer
        "update nodes",  # nodes are only patched, for the autonomy label
        "patch nodes --subresource=status",  # the Autonomy condition is the hubs' to write
        "create pods -n default",
        "update pods -n default",  # pods are only patched, for the toleration binding
        "delete pods -n default",
        "create pods --subresource=eviction -n default",
        "patch pods --subresource=status -n default",
        "patch namespaces",  # opting a namespace in to the binding is never the controller's decision
    ],
    CLOUD_SA: [
        "get secrets -n default",  # Secrets only in kube-system, never cluster-wide
        "list secrets -n default",  # ... unless cache-secrets is added (below)
        "get configmaps -n default",  # the cache streams only list and watch
        "delete nodeupgradejobs.operations.kubeedge.io",  # hubs write status, never the job
        "create validatingwebhookconfigurations.admissionregistration.k8s.io",
        "create pods -n default",
        "update tasks.diagnosis.kubediag.org -n default",  # a Task's status only, never its spec
        "delete tasks.diagnosis.kubediag.org -n default",
        "create tasks.diagnosis.kubediag.org -n default",
        "list diagnoses.diagnosis.kubediag.org -n default",  # one Diagnosis at a time, by name
        "update diagnoses.diagnosis.kubediag.org -n default",
        "update operations.diagnosis.kubediag.org --subresource=status",
        f"update {CSRS} --subresource=approval",  # the hubs never approve what they ask for
        f"approve {KUBELET_SIGNER}",
        f"delete {CSRS}",
        f"list {CSRS}",
    ],
}


def _can(cp: ControlPlane, who: str, access: str) -> bool:
    """``kubectl auth can-i``'s answer; a question it could not ask (a bad flag, a resource the server lacks)
    fails the test rather than reading as a refusal."""
    verb, resource = access.split()[:2]
    if resource.startswith(SIGNERS):
        return _may_for_signer(cp, who, verb, resource.removeprefix(SIGNERS))
    answer = cp.kubectl("auth", "can-i", *access.split(), f"--as={who}", check=False)
    assert answer.stdout.strip() in ("yes", "no"), f"{access}: {answer.stderr}"
    assert "doesn't have a resource type" not in answer.stderr, f"{access}: {answer.stderr}"
    return answer.stdout.strip() == "yes"


def _may_for_signer(cp: ControlPlane, who: str, verb: str, signer: str) -> bool:
    """A SubjectAccessReview's answer for ``verb`` on a signer: signers are RBAC's alone (no API serves them),
    so kubectl cannot ask about one (it sends the whole name as the resource, of any group)."""
    attributes = {"group": "certificates.k8s.io", "resource": "signers", "verb": verb, "name": signer}
    spec = {"user": who, "resourceAttributes": attributes}
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
    answer = cp.kubectl("create", "-f", "-", "-o", "json", input=json.dumps(review))
    return bool(json.loads(answer.stdout)["status"].get("allowed", False))


def test_each_service_account_may_do_its_roles_work_and_is_refused_the_rest(deployed: Deployed) -> None:
    """`kubectl auth can-i --as` each ServiceAccount: yes to every access its role uses, no to what it must not do."""
    wrong = [
        f"{who} {access}: no"
        for who, accesses in ALLOWED.items()
        for access in accesses
        if not _can(deployed.cp, who, access)
    ]
    wrong += [
        f"{who} {access}: yes"
        for who, accesses in REFUSED.items()
        for access in accesses
        if _can(deployed.cp, who, access)
    ]
    assert wrong == []


JOB_RESOURCES = tuple(f"{plural}.operations.kubeedge.io" for plural in ("nodeupgradejobs", "imageprepulljobs"))
USER_ACCESS = {
    "view": {
        **{f"{verb} {jobs}": True for verb in ("get", "list", "watch") for jobs in JOB_RESOURCES},
        **{f"{verb} {jobs}": False for verb in ("create", "patch", "delete") for jobs in JOB_RESOURCES},
        "list diagnoses.diagnosis.kubediag.org -n default": True,
        "list tasks.diagnosis.kubediag.org -n default": True,
        "create diagnoses.diagnosis.kubediag.org -n default": False,
    },
    "edit": {
        **{f"{verb} {jobs}": True for verb in ("list", "create", "patch", "delete") for jobs in JOB_RESOURCES},
        **{f"patch {jobs} --subresource=status": False for jobs in JOB_RESOURCES},
        "create diagnoses.diagnosis.kubediag.org -n default": True,
        "create operations.diagnosis.kubediag.org": True,
        "create tasks.diagnosis.kubediag.org -n default": False,
    },
}
"""What a user bound (cluster-wide) to the cluster's own ``view`` or ``edit`` role may do with nodetaskd's objects."""


async def test_view_and_edit_users_read_and_create_jobs_and_diagnoses_by_aggregation(deployed: Deployed) -> None:
    """Users bound to ``view`` read jobs and Diagnoses and change nothing; ``edit`` also creates and deletes them but
    writes no status (the rules reach those roles through the clusterrole-aggregation controller)."""
    cp = deployed.cp
    for role in USER_ACCESS:
        cp.kubectl("create", "clusterrolebinding", f"test-{role}", f"--clusterrole={role}", f"--user=user-{role}")

    def answers() -> dict[str, dict[str, bool]]:
        return {
            role: {access: _can(cp, f"user-{role}", access) for access in wanted}
            for role, wanted in USER_ACCESS.items()
        }

    with anyio.move_on_after(60):  # aggregation is the controller manager's, a moment after the apply
        # kubectl auth can-i: nothing to wait on but its answers
        while (found := await anyio.to_thread.run_sync(answers)) != USER_ACCESS:  # noqa: ASYNC110
            await anyio.sleep(1)
    assert found == USER_ACCESS


def test_the_controller_elects_only_in_its_namespace_and_patches_only_its_own_webhooks(deployed: Deployed) -> None:
    """The controller's Leases are those of its own namespace only; of the webhook configurations it may patch
    its own two, and create, change or delete no other (the manifests create them)."""
    assert "leaseNamespace" not in _config_map(deployed, "nodetaskd-controller", "controller.yaml")  # its own
    leases = "leases.coordination.k8s.io"
    configurations = [
        f"{resource}.admissionregistration.k8s.io"
        for resource in ("validatingwebhookconfigurations", "mutatingwebhookconfigurations")
    ]
    wanted = {
        **{f"{verb} {leases} -n {NAMESPACE}": True for verb in ("get", "create", "update")},
        **{f"{verb} {leases} -n {other}": False for verb in ("get", "create", "update") for other in OTHERS},
        f"update {leases} --all-namespaces": False,
        **{f"patch {resource}/nodetaskd": True for resource in configurations},
        **{f"create {resource}": False for resource in configurations},
        **{f"{verb} {resource}/nodetaskd": False for verb in ("update", "delete") for resource in configurations},
        **{f"{verb} {resource}/{OTHER}": False for verb in ("get", "patch", "update") for resource in configurations},
    }
    answers = {access: _can(deployed.cp, CONTROLLER_SA, access) for access in wanted}
    assert answers == wanted


def test_cache_secrets_adds_only_list_and_watch_of_secrets_to_the_hubs(deployed: Deployed) -> None:
    """`kubectl apply -k containers/deploy/cache-secrets` lets the hubs list and watch Secrets everywhere, still
    never get one outside kube-system nor write any."""
    cp = deployed.cp
    extra = OVERLAY / "cache-secrets"
    cp.kubectl("apply", "-k", str(extra))
    try:
        answers = {
            access: _can(cp, CLOUD_SA, access)
            for access in (
                "list secrets -n default",
                "watch secrets --all-namespaces",
                "get secrets -n default",
                "create secrets -n kube-system",
                "delete secrets -n default",
            )
        }
    finally:
        cp.kubectl("delete", "-k", str(extra))
    assert answers == {
        "list secrets -n default": True,
        "watch secrets --all-namespaces": True,
        "get secrets -n default": False,
        "create secrets -n kube-system": False,
        "delete secrets -n default": False,
    }
    assert not _can(cp, CLOUD_SA, "list secrets -n default")  # gone again with it


def _kubeconfig(deployed: Deployed, account: str) -> Path:
    """A kubeconfig with a token the API server issues for ``account`` (TokenRequest), as a Pod would mount."""
    token = deployed.cp.kubectl("-n", NAMESPACE, "create", "token", account, "--duration=1h").stdout.strip()
    ca = base64.b64encode(deployed.cp.ca_file.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": deployed.cp.server, "certificate-authority-data": ca}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": account}}],
        "current-context": "c",
    }
    path = deployed.home / f"{account}.kubeconfig"
    path.write_text(json.dumps(config))
    return path


def _mounted(deployed: Deployed, secret: str, directory: Path) -> Path:
    """The Secret's keys as files, as its volume mounts them."""
    data = json.loads(deployed.cp.kubectl("-n", NAMESPACE, "get", "secret", secret, "-o", "json").stdout)["data"]
    directory.mkdir(parents=True, exist_ok=True)
    for key, value in data.items():
        (directory / key).write_bytes(base64.b64decode(value))
    return directory


def _config_map(deployed: Deployed, name: str, key: str) -> dict[str, object]:
    data = json.loads(deployed.cp.kubectl("-n", NAMESPACE, "get", "configmap", name, "-o", "json").stdout)["data"]
    loaded: dict[str, object] = msgspec.yaml.decode(data[key].encode())
    return loaded


def _controller(
    deployed: Deployed, home: Path, identity: str, *, tls: Path, env: dict[str, str], **settings: object
) -> RoleProcess:
    """A controller as its ServiceAccount, with the ConfigMap's settings (``settings`` over them) and the webhook
    Secret's files in ``tls``; ``env`` is what the Deployment's downward API gives its pod."""
    config = {
        **_config_map(deployed, "nodetaskd-controller", "controller.yaml"),
        "kubeconfig": str(_kubeconfig(deployed, "nodetaskd-controller")),
        "identity": identity,
        "logFormat": "console",
        "tlsCertFile": str(tls / "tls.crt"),
        "tlsKeyFile": str(tls / "tls.key"),
        "tlsCaFile": str(tls / "ca.crt"),
        **settings,
    }
    path = home / f"{identity}.yaml"
    path.write_bytes(msgspec.yaml.encode(config))
    return RoleProcess(identity, path, "controller", home / f"{identity}.log", env=env)


def _hub(deployed: Deployed, home: Path, hub_id: str) -> tuple[RoleProcess, Path]:
    """A hub as its ServiceAccount, with the ConfigMap's settings and the hub Secret's files, on ports of its
    own choosing; and the file it reports them in."""
    tls = _mounted(deployed, "nodetaskd-hub-tls", home / "hub-tls")
    ports_file = home / f"{hub_id}.ports.json"
    config = {
        **_config_map(deployed, "nodetaskd-cloud", "cloud.yaml"),
        "kubeconfig": str(_kubeconfig(deployed, "nodetaskd-cloud")),
        "hubId": hub_id,
        "listen": "127.0.0.1:0",
        "httpListen": "127.0.0.1:0",
        "portsFile": str(ports_file),
        "logFormat": "console",
        "tlsCertFile": str(tls / "tls.crt"),
        "tlsKeyFile": str(tls / "tls.key"),
    }
    path = home / f"{hub_id}.yaml"
    path.write_bytes(msgspec.yaml.encode(config))
    return RoleProcess("hub", path, "cloud", home / f"{hub_id}.log"), ports_file


def _webhook_configs(deployed: Deployed) -> list[dict[str, object]]:
    return [
        json.loads(deployed.cp.kubectl("get", kind, "nodetaskd", "-o", "json").stdout)["webhooks"][0]["clientConfig"]
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")
    ]


async def test_controller_replicas_register_the_service_webhooks_with_the_one_mounted_ca(
    deployed: Deployed, tmp_path: Path
) -> None:
    """Two controllers as the ServiceAccount, with the ConfigMap's settings and the Secret's files: one leads,
    both set the shared CA on the Service-based webhooks, and each serves a certificate valid for the Service."""
    assert all("caBundle" not in config for config in _webhook_configs(deployed))  # as applied
    tls = _mounted(deployed, "nodetaskd-webhook-tls", tmp_path / "tls")
    picked = free_ports(4)
    ports = picked[0::2]
    replicas = [
        _controller(
            deployed,
            tmp_path,
            f"replica-{i}",
            tls=tls,
            env={"POD_NAMESPACE": NAMESPACE},
            listenHost="127.0.0.1",
            webhookPort=ports[i],
            metricsPort=picked[2 * i + 1],
        )
        for i in range(2)
    ]
    try:
        for replica in replicas:
            await replica.start()

        def registered() -> bool:
            logs = [r.log.read_text(errors="replace") for r in replicas]
            return all("webhook_configuration_updated" in log for log in logs)

        with anyio.fail_after(60):
            while not registered():
                assert all(r.alive for r in replicas), [r.log.read_text() for r in replicas]
                await anyio.sleep(0.2)
            while True:
                lease = json.loads(
                    deployed.cp.kubectl(
                        "-n", NAMESPACE, "get", "lease", "nodetaskd-controller", "-o", "json", check=False
                    ).stdout
                    or "{}"
                )
                if lease.get("spec", {}).get("holderIdentity") in ("replica-0", "replica-1"):
                    break
                await anyio.sleep(0.2)
        ca = (tls / "ca.crt").read_bytes()
        for config in _webhook_configs(deployed):
            assert base64.b64decode(config["caBundle"]) == ca  # type: ignore[arg-type]
            assert config["service"]["namespace"] == NAMESPACE  # type: ignore[index]
            assert config["service"]["name"] == "nodetaskd-webhook"  # type: ignore[index]
        client = ssl.create_default_context(cadata=ca.decode())
        for port in ports:
            # What the API server does: verify the certificate for the Service's name, then POST a review.
            answer = await anyio.to_thread.run_sync(_post_review, port, client)
            assert answer == 400  # not a review: refused by the webhook itself, over verified TLS
        assert all(r.alive for r in replicas)
    finally:
        for replica in replicas:
            await replica.stop()
    assert sorted(p.name for p in tls.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]  # nothing generated


def _post_review(port: int, client: ssl.SSLContext) -> int:
    """POST a body that is no AdmissionReview to the replica, as the API server would call the Service: the status."""
    request = (
        f"POST /validate HTTP/1.1\r\nHost: {WEBHOOK_HOST}\r\nContent-Type: application/json\r\n"
        "Content-Length: 2\r\nConnection: close\r\n\r\n{}"
    )
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        client.wrap_socket(raw, server_hostname=WEBHOOK_HOST) as tls,
    ):
        tls.sendall(request.encode())
        status_line = tls.recv(4096).split(b"\r\n", 1)[0]
    return int(status_line.split()[1])


async def test_a_hub_as_its_service_account_becomes_ready_with_the_mounted_certificate(
    deployed: Deployed, tmp_path: Path
) -> None:
    """A hub with the cloud ServiceAccount, the ConfigMap's settings and the hub Secret syncs jobs, watches the
    token Secrets (allowed in kube-system) and answers /readyz over TLS the edges' CA verifies."""
    hub, ports_file = _hub(deployed, tmp_path, "hub-under-test")
    client = ssl.create_default_context(cafile=str(deployed.hub_ca))

    # Ready does not wait for the watches (tokens are read one by one meanwhile; cache streams retry):
    # their first lists, which the RBAC must allow, are waited for in the log.
    def settled() -> bool:
        lines = hub.log.read_text(errors="replace").splitlines()
        kinds = {word for line in lines if "cache_watch_listed" in line for word in line.split()}
        tokens = any("token_secrets_listed" in line for line in lines)
        return (tokens and {"kind=Node", "kind=Pod", "kind=ConfigMap"} <= kinds) or any(
            "forbidden" in line.lower() for line in lines
        )

    try:
        await hub.start()
        http_port = (await hub.reported_ports(ports_file))["httpListen"]
        with anyio.fail_after(60):
            ready = functools.partial(answers_ok, f"https://127.0.0.1:{http_port}/readyz", context=client)
            while not await anyio.to_thread.run_sync(ready) or not settled():
                assert hub.alive, hub.log.read_text()
                await anyio.sleep(0.2)
    finally:
        await hub.stop()
    log = hub.log.read_text(errors="replace")
    assert "token_secrets_listed" in log
    assert "forbidden" not in log.lower()


def _host_address() -> str:
    """An IPv4 address of this machine that Endpoints may hold (the API server refuses loopback ones there)."""
    for addresses in psutil.net_if_addrs().values():
        for entry in addresses:
            if entry.family == socket.AF_INET:
                address = ipaddress.ip_address(entry.address)
                if not (address.is_loopback or address.is_link_local):
                    return entry.address
    pytest.fail("this machine has no IPv4 address but loopback and link-local ones, which Endpoints refuse")


def _job_phase(cp: ControlPlane, kind: str, name: str) -> str:
    found = json.loads(cp.kubectl("get", kind, name, "-o", "json").stdout)
    return str(found.get("status", {}).get("phase", ""))


async def test_a_job_goes_through_the_service_webhooks_and_completes_in_the_other_namespace(
    deployed: Deployed, tmp_path: Path
) -> None:
    """With the webhook Service's Endpoints naming the controller (as its pod's would), the API server calls the
    Service-based webhooks of the install in another namespace: they refuse a bad job and admit a good one, which
    completes on a hub and an edge, every role acting as its ServiceAccount."""
    cp = deployed.cp
    address = _host_address()
    webhook_port, metrics_port = free_ports(2)
    # No pod runs here, so no endpoints controller fills these in: they name the controller process, as the
    # Service's selector would name its pod. The API server calls the Endpoints' address
    # (--enable-aggregator-routing), checking the certificate for the Service's name.
    endpoints = {
        "apiVersion": "v1",
        "kind": "Endpoints",
        "metadata": {"name": "nodetaskd-webhook", "namespace": NAMESPACE},
        "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": "webhook", "port": webhook_port}]}],
    }
    cp.kubectl("apply", "-f", "-", input=json.dumps(endpoints))
    # What the Deployment's downward API gives the pod: its namespace and its address.
    controller = _controller(
        deployed,
        tmp_path,
        "the-controller",
        tls=_mounted(deployed, "nodetaskd-webhook-tls", tmp_path / "webhook-tls"),
        env={"POD_NAMESPACE": NAMESPACE, "POD_IP": address},
        webhookPort=webhook_port,
        metricsPort=metrics_port,
    )
    hub, ports_file = _hub(deployed, tmp_path, "the-hub")
    node = "edge-in-other-namespace"
    tokens = await register_edges(cp, [node])
    version, good_name = f"{GROUP}/v1alpha2", "through-the-service"
    bad = {"apiVersion": version, "kind": "NodeUpgradeJob", "metadata": {"name": "bad"}, "spec": {"version": "x"}}
    good = {
        "apiVersion": version,
        "kind": "ImagePrePullJob",
        "metadata": {"name": good_name},
        "spec": {"imagePrePullTemplate": {"images": ["example/a:1"], "nodeNames": [node]}},
    }
    try:
        await controller.start()
        await hub.start()
        edge_port = (await hub.reported_ports(ports_file))["listen"]
        with anyio.fail_after(60):
            while "webhook_configuration_updated" not in controller.log.read_text(errors="replace"):
                assert controller.alive, controller.log.read_text()
                await anyio.sleep(0.2)
        refused = cp.kubectl("create", "-f", "-", input=json.dumps(bad), check=False)
        assert refused.returncode != 0
        assert f'admission webhook "{VALIDATING_WEBHOOK_NAME}" denied the request' in refused.stderr, refused.stderr
        cp.kubectl("create", "-f", "-", input=json.dumps(good))
        edge = light_edge(
            node,
            f"wss://127.0.0.1:{edge_port}",
            tokens[node],
            ssl_context=ssl.create_default_context(cafile=str(deployed.hub_ca)),
        )
        async with running_edges([edge]):
            with anyio.fail_after(90):
                while _job_phase(cp, "imageprepulljob", good_name) != "Completed":
                    assert controller.alive, controller.log.read_text()
                    assert hub.alive, hub.log.read_text()
                    await anyio.sleep(0.5)
        assert [action.route.node for action in edge.run_actions] == [node]
        # While the controller runs, so that it takes its finalizer away.
        await anyio.to_thread.run_sync(functools.partial(cp.kubectl, "delete", "imageprepulljob", good_name))
    finally:
        await hub.stop()
        await controller.stop()
        cp.kubectl("-n", NAMESPACE, "delete", "endpoints", "nodetaskd-webhook", "--ignore-not-found")
