"""The local cluster's certificates (with the ``openssl`` command) and the kubeconfigs that carry them.

One cluster CA signs the API server's serving certificate and every client certificate; the API server
trusts it for client certificates (``--client-ca-file``) and kube-controller-manager signs the cluster's
CertificateSigningRequests with it. Keys are ECDSA P-256 (a start makes several, and an RSA key costs a
loaded machine half a second), certificates valid for ten years (a test cluster lives minutes; an
expiry must never be what a test meets).

Standard library only, like the scripts that use it.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tools.provision import host

DAYS: Final = 3650
APISERVER_NAMES: Final = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)
"""DNS names in the API server's serving certificate, besides its addresses (what in-cluster clients and
kubeconfigs call it)."""


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key, on disk."""

    cert: Path
    key: Path


def _openssl(*args: str) -> str:
    return host.run_quiet(["openssl", *args], what=f"openssl {args[0]}")


def _new_key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))
    os.chmod(path, 0o600)


def _subject(common_name: str, organizations: Sequence[str]) -> str:
    for part in (common_name, *organizations):
        if not part or any(c in part for c in "/=+,\\\n"):
            raise host.ControlPlaneError(f"certificate subject part {part!r} is empty or holds / = + , \\ or a newline")
    return "".join(f"/O={o}" for o in organizations) + f"/CN={common_name}"


def make_ca(directory: Path, name: str = "ca", *, common_name: str = "nodetaskd-cluster-ca") -> KeyPair:
    """A self-signed CA certificate ``<name>.crt`` and its key ``<name>.key`` in ``directory``."""
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    _new_key(pair.key)
    _openssl(
        "req",
        "-x509",
        "-new",
        "-key",
        str(pair.key),
        "-subj",
        _subject(common_name, ()),
        "-days",
        str(DAYS),
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        "-out",
        str(pair.cert),
    )
    return pair


def issue(
    ca: KeyPair,
    directory: Path,
    name: str,
    *,
    common_name: str,
    organizations: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    server: bool = False,
) -> KeyPair:
    """A certificate signed by ``ca`` for ``CN=common_name`` (``O=`` each of ``organizations``: the groups
    Kubernetes reads from a client certificate), as ``<name>.crt`` / ``<name>.key`` in ``directory``.

    A client certificate unless ``server``, which also needs the names and addresses it serves under."""
    pair = KeyPair(directory / f"{name}.crt", directory / f"{name}.key")
    if server and not (dns_names or ip_addresses):
        raise host.ControlPlaneError(f"serving certificate {name} needs at least one DNS name or IP address")
    _new_key(pair.key)
    csr = directory / f".{name}.csr"
    extensions = directory / f".{name}.ext"
    lines = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}",
    ]
    sans = [f"DNS:{d}" for d in dns_names] + [f"IP:{a}" for a in ip_addresses]
    if sans:
        lines.append(f"subjectAltName={','.join(sans)}")
    extensions.write_text("\n".join(lines) + "\n")
    try:
        _openssl("req", "-new", "-key", str(pair.key), "-subj", _subject(common_name, organizations), "-out", str(csr))
        _openssl(
            "x509",
            "-req",
            "-in",
            str(csr),
            "-CA",
            str(ca.cert),
            "-CAkey",
            str(ca.key),
            # A random serial, not a serial file: certificates may be issued concurrently.
            "-set_serial",
            str(secrets.randbits(63)),
            "-days",
            str(DAYS),
            "-extfile",
            str(extensions),
            "-out",
            str(pair.cert),
        )
    finally:
        csr.unlink(missing_ok=True)
        extensions.unlink(missing_ok=True)
    return pair


def _config(server: str, cluster: dict[str, str], user_name: str, user: dict[str, str]) -> str:
    """A kubeconfig (JSON is valid YAML) with one cluster, user and context, all embedded: the file stays
    valid wherever it is copied."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "nodetaskd", "cluster": {"server": server, **cluster}}],
        "users": [{"name": user_name, "user": user}],
        "contexts": [{"name": "nodetaskd", "context": {"cluster": "nodetaskd", "user": user_name}}],
        "current-context": "nodetaskd",
        "preferences": {},
    }
    return json.dumps(config, indent=2) + "\n"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def token_kubeconfig(server: str, ca_pem: bytes, user: str, token: str) -> str:
    """A kubeconfig for a bearer ``token``; TLS is verified against ``ca_pem``, never skipped."""
    return _config(server, {"certificate-authority-data": _b64(ca_pem)}, user, {"token": token})


def cert_kubeconfig(server: str, ca_pem: bytes, user: str, pair: KeyPair) -> str:
    """A kubeconfig for the client certificate ``pair``; TLS is verified against ``ca_pem``."""
    credentials = {
        "client-certificate-data": _b64(pair.cert.read_bytes()),
        "client-key-data": _b64(pair.key.read_bytes()),
    }
    return _config(server, {"certificate-authority-data": _b64(ca_pem)}, user, credentials)


def plain_kubeconfig(server: str, user: str = "anonymous") -> str:
    """A kubeconfig with no credentials and no CA: for a plain-HTTP ``server`` such as a device's loopback
    endpoint, which authenticates its clients by where they connect from."""
    if not server.startswith("http://"):
        raise host.ControlPlaneError(f"a kubeconfig without credentials is only for a plain-HTTP server, not {server}")
    return _config(server, {}, user, {})


__all__ = [
    "APISERVER_NAMES",
    "DAYS",
    "KeyPair",
    "cert_kubeconfig",
    "issue",
    "make_ca",
    "plain_kubeconfig",
    "token_kubeconfig",
]
