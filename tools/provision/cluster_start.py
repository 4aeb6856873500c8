"""How a local control plane starts: its binaries, tokens, flags and processes, in order.

Standard library only, like the scripts that use it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from tools import ports
from tools.provision import host, kubebuild
from tools.provision.cluster import (
    APISERVER_READY_TIMEOUT,
    ETCD_READY_TIMEOUT,
    IDENTITIES,
    STATE_FILE,
    Binaries,
    ControlPlane,
)

_RUNTIME_PACKAGES: Final[Mapping[str, str]] = {
    # executable -> Debian package providing it
    "etcd": "etcd-server",
    "kubectl": "kubernetes-client",
    "openssl": "openssl",
}

_OWNED_NAMES: Final = (
    STATE_FILE,
    "etcd-data",
    "pki",
    "tokens.csv",
    "sa.key",
    "etcd.log",
    "kube-apiserver.log",
    *(f"{name}.kubeconfig" for name in IDENTITIES),
)


def ensure_binaries() -> Binaries:
    """etcd, kubectl (Debian packages) and kube-apiserver (built from Debian's source, with every other
    missing product of :mod:`tools.provision.kubebuild`), installed or built if missing. The fast path
    (everything present) takes milliseconds and no lock."""
    found = host.ensure_executables(_RUNTIME_PACKAGES)
    built = kubebuild.ensure_built(("kube-apiserver",))
    return Binaries(etcd=found["etcd"], kube_apiserver=built["kube-apiserver"], kubectl=found["kubectl"])


def prepare_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` or clear a previous (stopped) run out of it.

    Only entries this module creates are removed, and only when our state
    record is present: pointing NODETASKD_CLUSTER_DIR at a populated
    directory by mistake must not delete anything."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    entries = {p.name for p in state_dir.iterdir()}
    if not entries:
        return
    if STATE_FILE not in entries:
        raise host.ControlPlaneError(f"refusing to use non-empty directory {state_dir} (no {STATE_FILE} in it)")
    previous = ControlPlane.load(state_dir)
    if any(previous.processes_alive().values()):
        raise host.ControlPlaneError(f"a control plane is still running from {state_dir}; stop it first")
    for name in _OWNED_NAMES:
        path = state_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def _kubeconfig(server: str, ca_pem: bytes, user: str, token: str) -> str:
    """A kubeconfig (JSON is valid YAML) with the CA embedded: the file stays
    valid wherever it is copied, and TLS is verified, never skipped."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "nodetaskd",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_pem).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "nodetaskd", "context": {"cluster": "nodetaskd", "user": user}}],
        "current-context": "nodetaskd",
        "preferences": {},
    }
    return json.dumps(config, indent=2) + "\n"


def start(
    state_dir: Path,
    binaries: Binaries | None = None,
    *,
    ready_timeout: float = APISERVER_READY_TIMEOUT,
    detach: bool = False,
) -> ControlPlane:
    """Start etcd and kube-apiserver with state in ``state_dir``; return once
    ``/readyz`` answers 200 for the admin identity.

    Ports are picked fresh, tokens and the service-account key are generated
    per start. On any failure everything started so far is stopped again.
    With ``detach=False`` (tests) the kernel also terminates the processes if
    the calling process dies without running :meth:`ControlPlane.stop`;
    ``detach=True`` (the CLI's ``up``) lets them outlive the caller.
    """
    binaries = binaries or ensure_binaries()
    state_dir = state_dir.expanduser().resolve()
    prepare_state_dir(state_dir)

    etcd_port, peer_port, api_port = ports.free_ports(3)
    pki_dir = state_dir / "pki"
    pki_dir.mkdir(mode=0o700)

    sa_key = state_dir / "sa.key"
    host.run_quiet(["openssl", "genrsa", "-out", str(sa_key), "2048"], what="openssl genrsa")
    sa_key.chmod(0o600)

    tokens = {name: secrets.token_urlsafe(32) for name in IDENTITIES}
    token_lines = [
        f'{tokens[name]},{ident.user},{ident.user},"{",".join(ident.groups)}"\n' for name, ident in IDENTITIES.items()
    ]
    token_file = state_dir / "tokens.csv"
    host.write_atomic(token_file, "".join(token_lines), mode=0o600)

    etcd_url = f"http://127.0.0.1:{etcd_port}"
    peer_url = f"http://127.0.0.1:{peer_port}"
    etcd_args = [
        str(binaries.etcd),
        "--name=nodetaskd",
        f"--data-dir={state_dir / 'etcd-data'}",
        f"--listen-client-urls={etcd_url}",
        f"--advertise-client-urls={etcd_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=nodetaskd={peer_url}",
        "--initial-cluster-state=new",
        "--log-level=warn",
        "--logger=zap",
    ]
    apiserver_args = [
        str(binaries.kube_apiserver),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1",
        f"--secure-port={api_port}",
        "--insecure-port=0",
        f"--cert-dir={pki_dir}",
        f"--token-auth-file={token_file}",
        "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={sa_key}",
        f"--service-account-signing-key-file={sa_key}",
        "--service-cluster-ip-range=10.0.0.0/24",
        "--profiling=false",
        "--v=1",
    ]
    cp = ControlPlane(
        state_dir=state_dir,
        server=f"https://127.0.0.1:{api_port}",
        etcd_url=etcd_url,
        ca_file=pki_dir / "apiserver.crt",
        kubeconfigs={name: state_dir / f"{name}.kubeconfig" for name in IDENTITIES},
        tokens=tokens,
        pids={},
        logs={name: state_dir / f"{name}.log" for name in ("etcd", "kube-apiserver")},
        binaries=binaries,
        apiserver_args=apiserver_args,
        detached=detach,
    )
    try:
        cp._spawn("etcd", etcd_args)
        cp._save()
        cp._wait_etcd_ready(ETCD_READY_TIMEOUT)
        cp._spawn("kube-apiserver", apiserver_args)
        cp._save()
        cp._wait_apiserver_ready(ready_timeout)
        ca_pem = cp.ca_file.read_bytes()
        for name, ident in IDENTITIES.items():
            host.write_atomic(
                cp.kubeconfigs[name], _kubeconfig(cp.server, ca_pem, ident.user, tokens[name]), mode=0o600
            )
    except BaseException:
        with contextlib.suppress(host.ControlPlaneError):
            cp.stop()
        raise
    return cp


__all__ = ["ensure_binaries", "prepare_state_dir", "start"]
