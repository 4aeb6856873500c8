"""Devices' node certificates through the real CSR API: an agent with its node API on gets ``system:node:<node>``'s
certificate (its hub creates the request, the controller approves it, kube-controller-manager signs it), and
that certificate can do what the node may and nothing else; an edge asking for another node's certificate,
and anyone but a hub asking for a node's, gets none.

Everything runs as in a cluster: the controller, a hub (``apiRelay.enabled``) and the agent as processes with
their own identities; the control plane authorizes with Node and RBAC, admits with NodeRestriction and signs
with kube-controller-manager.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import msgspec
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from nodetask import messages
from nodetask.messages import NODE_CREDENTIALS_CAPABILITY, Hello, NodeCredentials, NodeCredentialsRequest, Welcome
from roles.edge.ws_link import open_ws_link
from roles.kube import Kube
from roles.kube.resources import CSRS
from schemas.certificates import (
    APPROVED,
    DENIED,
    KUBELET_CLIENT_SIGNER,
    NODE_LABEL,
    NODE_USAGES,
    CertificateSigningRequest,
    CertificateSigningRequestSpec,
)
from schemas.meta import ObjectMeta
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import admin, register_edges
from tests.integration.hubs import eventually
from tests.integration.objects import kubectl, unique
from tests.integration.processes import fleet
from tools.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.slow(90)]

ISSUE_LIMIT_S = 180.0
"""From the agent's start to its certificate on disk: Python's start on a loaded machine, then the CSR's way."""


def _request_pem(node: str) -> str:
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    key = ec.generate_private_key(ec.SECP256R1())
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM).decode("ascii")


def _csr(node: str, *, name: str) -> CertificateSigningRequest:
    """A request for ``node``'s certificate exactly as a hub makes one."""
    return CertificateSigningRequest(
        metadata=ObjectMeta(name=name, labels={NODE_LABEL: node}),
        spec=CertificateSigningRequestSpec(
            request=base64.b64encode(_request_pem(node).encode()).decode(),
            signer_name=KUBELET_CLIENT_SIGNER,
            usages=NODE_USAGES,
        ),
    )


def _as_node(cp: ControlPlane, credentials: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl with the node's certificate and nothing else (no kubeconfig's user)."""
    empty = credentials / "empty.kubeconfig"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    argv = [
        str(cp.binaries.kubectl),
        f"--kubeconfig={empty}",
        f"--server={cp.server}",
        f"--certificate-authority={credentials / 'ca.crt'}",
        f"--client-certificate={credentials / 'node.crt'}",
        f"--client-key={credentials / 'node.key'}",
        *args,
    ]
    environment = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=environment)


def _status_of(url: str) -> int:
    """The HTTP status of a GET (an error status too)."""
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code


async def _requests_for(cp: ControlPlane, node: str) -> list[CertificateSigningRequest]:
    async with admin(cp) as kube:
        found, _, _ = await kube.list(CSRS, label_selector=f"{NODE_LABEL}={node}")
    return found


async def _ask_as(url: str, node: str, token: str, request: NodeCredentialsRequest) -> NodeCredentials:
    """Open a session as ``node`` with its token, ask for a certificate, and return the hub's answer."""
    headers = [(b"authorization", f"Bearer {token}".encode())]
    async with open_ws_link(f"{url}/nodes/{node}", headers=headers, ssl_context=None) as link:
        hello = Hello(node=node, version="v0.1.0", capabilities=(NODE_CREDENTIALS_CAPABILITY,))
        await link.send(messages.encode(hello))
        welcome = messages.decode_downstream(await link.receive())
        assert isinstance(welcome, Welcome), welcome
        assert NODE_CREDENTIALS_CAPABILITY in welcome.capabilities
        await link.send(messages.encode(request))
        with anyio.fail_after(120):
            while True:
                answer = messages.decode_downstream(await link.receive())
                if isinstance(answer, NodeCredentials):
                    return answer


async def test_an_agent_gets_its_nodes_certificate_which_can_do_what_the_node_may_and_no_more(
    crds: ControlPlane, tmp_path: Path
) -> None:
    """The agent's certificate is system:node:<node>'s, issued through an approved request; with it the node reads
    its Node, and is refused (403) a Secret no pod of its node references and a patch of another Node."""
    other, secret = unique("other-node"), unique("unreferenced")
    await register_edges(crds, [other])
    await kubectl(crds, "create", "secret", "generic", secret, "-n", "default", "--from-literal=k=v")
    [node_api_port] = free_ports(1)
    async with fleet(
        crds,
        tmp_path,
        edges=1,
        hubs=1,
        hub_options={"apiRelay": {"enabled": True}},
        edge_options=lambda _: {"nodeApi": {"enabled": True, "port": node_api_port}},
    ) as running:
        [node] = running.edges
        credentials = tmp_path / node / "data" / "node-credentials"
        await eventually((credentials / "node.crt").is_file, limit_s=ISSUE_LIMIT_S, interval=0.5)
        certificate = x509.load_pem_x509_certificate((credentials / "node.crt").read_bytes())
        assert certificate.subject.rfc4514_string() == f"CN=system:node:{node},O=system:nodes"
        requests = await _requests_for(crds, node)
        assert {r.spec.username for r in requests} == {"nodetaskd:cloud"}
        approvals = [c for r in requests if (c := r.condition(APPROVED)) is not None]
        assert [c.reason for c in approvals][:1] == ["NodetaskdApproved"]

        read = functools.partial(_as_node, crds, credentials)
        own = await anyio.to_thread.run_sync(read, "get", "node", node, "-o", "name")
        assert own.returncode == 0, own.stderr
        secret_read = await anyio.to_thread.run_sync(read, "get", "-n", "default", "secret", secret)
        assert "Forbidden" in secret_read.stderr, secret_read
        patch = json.dumps({"metadata": {"labels": {"taken-over": "yes"}}})
        foreign = await anyio.to_thread.run_sync(read, "patch", "node", other, "--type=merge", "-p", patch)
        assert "Forbidden" in foreign.stderr, foreign
        assert (credentials / "node.key").stat().st_mode & 0o077 == 0

        # The device itself, through its node API endpoint and the hub's relay, is that node and no more.
        endpoint = f"http://127.0.0.1:{node_api_port}"
        assert await anyio.to_thread.run_sync(_status_of, f"{endpoint}/api/v1/nodes/{node}") == 200
        assert (
            await anyio.to_thread.run_sync(_status_of, f"{endpoint}/api/v1/namespaces/default/secrets/{secret}") == 403
        )


async def test_the_hub_refuses_an_edge_asking_for_another_nodes_certificate(crds: ControlPlane, tmp_path: Path) -> None:
    """An edge (its token checked out) asking for a certificate of another node's name is refused by its hub, and
    no CertificateSigningRequest is created for it at all; its own request is answered with its certificate."""
    intruder, victim = unique("intruder"), unique("victim")
    tokens = await register_edges(crds, [intruder, victim])
    async with fleet(crds, tmp_path, edges=0, hubs=1, hub_options={"apiRelay": {"enabled": True}}) as running:
        [url] = running.hub_urls
        ask = functools.partial(_ask_as, url, intruder, tokens[intruder])
        refused = await ask(NodeCredentialsRequest(id="a", csr=_request_pem(victim)))
        assert f"system:node:{victim}" in refused.error
        assert refused.certificate == ""
        assert await _requests_for(crds, victim) == []
        assert await _requests_for(crds, intruder) == []  # the hub refused it itself: nothing reached the API
        issued = await ask(NodeCredentialsRequest(id="b", csr=_request_pem(intruder)))
        assert issued.error == ""
        subject = x509.load_pem_x509_certificate(issued.certificate.encode()).subject
        assert subject.rfc4514_string() == f"CN=system:node:{intruder},O=system:nodes"


async def test_the_controller_approves_no_one_elses_request_and_denies_a_hubs_for_a_node_without_a_token(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """A request for an edge node's certificate created by anyone but a hub is left alone (neither approved nor
    denied, while a hub's later request is approved); a hub's request for a node without a join token is denied
    naming the missing Secret."""
    edge, stranger = unique("edge"), unique("stranger")
    await register_edges(crds, [edge])
    creator = unique("csr-creator")
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": creator},
            "rules": [{"apiGroups": [CSRS.api_version.split("/")[0]], "resources": [CSRS.plural], "verbs": ["create"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": creator},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": creator},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": creator}],
        },
    ]
    for document in rbac:
        await kubectl(crds, "apply", "-f", "-", input=json.dumps(document))
    foreign = unique("foreign")
    manifest = msgspec.json.encode(_csr(edge, name=foreign)).decode()
    document = json.loads(manifest) | {"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest"}
    await kubectl(crds, "create", f"--as={creator}", "-f", "-", input=json.dumps(document))
    async with fleet(crds, tmp_path, edges=0, hubs=0), admin(crds) as kube:
        # As a hub (the cloud role's identity), straight to the API server.
        mine = await cloud_kube.create(CSRS, _csr(edge, name=unique("hub")))
        orphan = await cloud_kube.create(CSRS, _csr(stranger, name=unique("hub")))

        async def decided(name: str, kind: str) -> bool:
            return (await kube.get(CSRS, name)).condition(kind) is not None

        with anyio.fail_after(120):
            while True:
                if await decided(mine.metadata.name, APPROVED) and await decided(orphan.metadata.name, DENIED):
                    break
                await anyio.sleep(0.5)
        denial = (await kube.get(CSRS, orphan.metadata.name)).condition(DENIED)
        assert denial is not None
        assert f"kube-system/nodetaskd-edge-{stranger}" in denial.message
        untouched = await kube.get(CSRS, foreign)
        assert untouched.status.conditions == ()
