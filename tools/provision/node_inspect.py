"""Who may ask a node's kubelet API, and the one question the harness asks it: ``/configz``.

Each node has a client CA of its own (``inspector/`` in its state directory) that its kubelet alone trusts
(``authentication.x509.clientCAFile``), and one client certificate it signed, the harness's. Nothing else holds a
certificate of that CA: not the node's agent, not another node, not the API server, so the kubelet's API answers
this harness and nobody else (anonymous requests and webhook authentication stay off), whatever its
``AlwaysAllow`` authorizes. Standard library only, like the other provisioning scripts.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from pathlib import Path
from typing import Any, Final

from tools.provision import pki

CA_NAME: Final = "ca"
CLIENT_NAME: Final = "inspector"


def client_ca(directory: Path) -> Path:
    """The CA certificate the node's kubelet trusts for its clients."""
    return directory / f"{CA_NAME}.crt"


def make_inspector(directory: Path, node: str) -> pki.KeyPair:
    """The node's client CA and the harness's certificate, in ``directory`` (created)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    ca = pki.make_ca(directory, CA_NAME, common_name=f"{node}-kubelet-clients")
    return pki.issue(ca, directory, CLIENT_NAME, common_name="nodetaskd-inspector")


def configz(directory: Path, port: int) -> dict[str, Any]:
    """The KubeletConfiguration the kubelet on ``127.0.0.1:port`` runs with, as its ``/configz`` answers it."""
    context = ssl.create_default_context()
    # The kubelet serves a certificate it made for itself: nothing signed it, and this is loopback.
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    client = pki.KeyPair(directory / f"{CLIENT_NAME}.crt", directory / f"{CLIENT_NAME}.key")
    context.load_cert_chain(client.cert, client.key)
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/configz", timeout=5, context=context) as answer:
        body: dict[str, Any] = json.loads(answer.read())
    return dict(body["kubeletconfig"])


__all__ = ["client_ca", "configz", "make_inspector"]
