"""The handle on a running local control plane: etcd, kube-apiserver and kube-controller-manager on
127.0.0.1, owned by PID, with a kubeconfig per identity and the cluster CA that signs everyone's
certificates. :func:`tools.provision.cluster_start.start` starts one; :meth:`ControlPlane.load` finds one
started by the CLI again.

Standard library only, like the scripts that use it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final

from tools.provision import children, host, pki

DEFAULT_RBAC_DIR: Final = host.REPO_ROOT / "containers" / "rbac"
WEBHOOK_REGISTRATION_RBAC: Final = DEFAULT_RBAC_DIR / "webhook-registration"
"""Applied here besides the roles' RBAC: the controllers run outside this control plane, where no
manifest creates their webhook configurations, so they create them (``containers/deploy`` ships them)."""

STATE_FILE: Final = "controlplane.json"
"""Marker + record of a started control plane inside its state directory."""

APISERVER_READY_TIMEOUT: Final = 90.0
ETCD_READY_TIMEOUT: Final = 30.0
CONTROLLER_MANAGER_READY_TIMEOUT: Final = 60.0
PROCESSES: Final = ("etcd", "kube-apiserver", "kube-controller-manager")
"""In start order; stopped in reverse."""

_NODE_NAME: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class Identity:
    """A static-token identity known to the apiserver (``--token-auth-file``)."""

    name: str
    user: str
    groups: tuple[str, ...]


IDENTITIES: Final[Mapping[str, Identity]] = {
    i.name: i
    for i in (
        Identity("admin", "nodetaskd-admin", ("system:masters",)),
        Identity("controller", "nodetaskd:controller", ("nodetaskd:controllers",)),
        Identity("cloud", "nodetaskd:cloud", ("nodetaskd:clouds",)),
        Identity("edge", "nodetaskd:edge", ("nodetaskd:edges",)),
    )
}
"""Users and groups the RBAC manifests in ``containers/rbac`` bind to. Tokens
are random per start; a kubeconfig is written for each identity."""


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the executables a control plane needs."""

    etcd: Path
    kube_apiserver: Path
    kubectl: Path
    kube_controller_manager: Path


def http_get(url: str, *, token: str | None = None, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver + kube-controller-manager on 127.0.0.1.

    ``kubeconfigs``/``tokens`` are keyed by identity name (see :data:`IDENTITIES`: admin, controller,
    cloud, edge). ``ca_file`` is the cluster CA: it signed the API server's serving certificate (so
    clients verify the server against it) and every client certificate (:meth:`node_kubeconfig`); its
    key is ``ca_key_file``. All of it is kept across :meth:`restart_apiserver`, so clients need no
    reconfiguring.
    """

    state_dir: Path
    server: str
    etcd_url: str
    ca_file: Path
    ca_key_file: Path
    kubeconfigs: dict[str, Path]
    tokens: dict[str, str]
    pids: dict[str, int]
    logs: dict[str, Path]
    binaries: Binaries
    apiserver_args: list[str]
    controller_manager_args: list[str]
    controller_manager_health: str
    """The ``/healthz`` URL of kube-controller-manager's own (self-signed) HTTPS port."""
    detached: bool = False
    _children: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False, compare=False)

    # -- convenience -------------------------------------------------------

    def kubeconfig(self, identity: str = "admin") -> Path:
        return self.kubeconfigs[identity]

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfigs["admin"]

    @property
    def controller_kubeconfig(self) -> Path:
        return self.kubeconfigs["controller"]

    @property
    def cloud_kubeconfig(self) -> Path:
        return self.kubeconfigs["cloud"]

    @property
    def edge_kubeconfig(self) -> Path:
        return self.kubeconfigs["edge"]

    @property
    def ca(self) -> pki.KeyPair:
        return pki.KeyPair(self.ca_file, self.ca_key_file)

    def kubectl(
        self,
        *args: str,
        identity: str = "admin",
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl as ``identity``; with ``check`` a failure raises
        :class:`ControlPlaneError` carrying kubectl's stderr."""
        argv = [
            str(self.binaries.kubectl),
            f"--kubeconfig={self.kubeconfigs[identity]}",
            *args,
        ]
        result = subprocess.run(
            argv,
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
        )
        if check and result.returncode != 0:
            detail = " ".join(result.stderr.split()) or f"exit {result.returncode}"
            raise host.ControlPlaneError(f"kubectl {shlex.join(args)} (as {identity}) failed: {detail}")
        return result

    def apply_rbac(
        self, rbac_dir: Path = DEFAULT_RBAC_DIR, *, extras: Sequence[Path] = (WEBHOOK_REGISTRATION_RBAC,)
    ) -> None:
        """``kubectl apply`` every manifest in ``rbac_dir``, then in each of ``extras``, as admin (a
        directory's kustomization, when it has one)."""
        for directory in (rbac_dir, *extras):
            if (directory / "kustomization.yaml").is_file():
                self.kubectl("apply", "-k", str(directory))
                continue
            manifests = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
            if not manifests:
                raise host.ControlPlaneError(f"no RBAC manifests in {directory}")
            args = ["apply"]
            for manifest in manifests:
                args += ["-f", str(manifest)]
            self.kubectl(*args)

    # -- node credentials ----------------------------------------------------

    def node_certificate(self, node: str, directory: Path | None = None) -> pki.KeyPair:
        """A client certificate for ``system:node:<node>`` in group ``system:nodes``, signed by the cluster
        CA, as ``<directory>/<node>.crt`` and ``.key`` (default directory: ``state_dir/nodes``).

        What a kubelet needs to be that node: the Node authorizer and NodeRestriction admission then let
        it do exactly a node's work. (The product gets its nodes' certificates through the CSR API.)"""
        if len(node) > 253 or not _NODE_NAME.match(node):
            raise host.ControlPlaneError(f"{node!r} is not a valid node name (a lower-case DNS subdomain)")
        directory = directory or self.state_dir / "nodes"
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        return pki.issue(self.ca, directory, node, common_name=f"system:node:{node}", organizations=("system:nodes",))

    def node_kubeconfig(self, node: str, directory: Path | None = None) -> Path:
        """A kubeconfig ``<directory>/<node>.kubeconfig`` for this API server as ``system:node:<node>``
        (:meth:`node_certificate`, embedded)."""
        pair = self.node_certificate(node, directory)
        path = pair.cert.with_suffix(".kubeconfig")
        config = pki.cert_kubeconfig(self.server, self.ca_file.read_bytes(), f"system:node:{node}", pair)
        host.write_atomic(path, config, mode=0o600)
        return path

    # -- health ------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context that verifies the apiserver against the cluster CA (hostname
        127.0.0.1 is in the certificate's SANs)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def is_ready(self) -> bool:
        """GET /readyz as admin, TLS verified."""
        try:
            status, _ = http_get(f"{self.server}/readyz", token=self.tokens["admin"], context=self.ssl_context())
        except (OSError, ssl.SSLError):
            return False
        return status == HTTPStatus.OK

    def controller_manager_healthy(self) -> bool:
        """GET kube-controller-manager's /healthz (its serving certificate is its own, self-signed)."""
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        try:
            status, _ = http_get(self.controller_manager_health, context=context)
        except (OSError, ssl.SSLError):
            return False
        return status == HTTPStatus.OK

    def processes_alive(self) -> dict[str, bool]:
        return {name: children.pid_is_ours(pid, str(self.state_dir)) for name, pid in self.pids.items()}

    # -- lifecycle ---------------------------------------------------------

    def stop(self) -> None:
        """Stop kube-controller-manager, kube-apiserver, then etcd (by recorded PID; SIGKILL after
        :data:`children.STOP_GRACE` seconds). Idempotent."""
        errors: list[str] = []
        for name in reversed(PROCESSES):
            pid = self.pids.get(name)
            if pid is None:
                continue
            try:
                children.terminate(pid, str(self.state_dir), self._children.get(name))
            except host.ControlPlaneError as exc:
                errors.append(str(exc))
            self._children.pop(name, None)
        if errors:
            raise host.ControlPlaneError("; ".join(errors))

    def restart_apiserver(self, timeout: float = APISERVER_READY_TIMEOUT) -> None:
        """Stop and start kube-apiserver only (same port, certs, tokens, etcd)
        and wait until ready -- for "a watch survives an apiserver restart"."""
        pid = self.pids.get("kube-apiserver")
        if pid is not None:
            children.terminate(pid, str(self.state_dir), self._children.pop("kube-apiserver", None))
        self._spawn("kube-apiserver", self.apiserver_args)
        self._save()
        self._wait_apiserver_ready(timeout)

    # -- internals ---------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        child = children.spawn(name, argv, log=self.logs[name], detach=self.detached)
        self._children[name] = child
        self.pids[name] = child.pid

    def _check_alive(self, name: str) -> None:
        child = self._children.get(name)
        if child is not None and child.poll() is not None:
            raise host.ControlPlaneError(
                f"{name} exited with status {child.returncode} during start-up; "
                f"log {self.logs[name]}:\n{children.tail(self.logs[name])}"
            )

    def _wait(self, name: str, timeout: float, probe: Callable[[], str | None]) -> None:
        """Until ``probe()`` gives None (ready) rather than why not; fails early if ``name`` exits."""
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive(name)
            last = probe()
            if last is None:
                return
            if time.monotonic() >= deadline:
                raise host.ControlPlaneError(
                    f"{name} not ready after {timeout:.0f}s ({last}); "
                    f"log {self.logs[name]}:\n{children.tail(self.logs[name])}"
                )
            time.sleep(0.25)

    def _wait_etcd_ready(self, timeout: float) -> None:
        def probe() -> str | None:
            try:
                status, body = http_get(f"{self.etcd_url}/health")
            except OSError as exc:
                return str(exc)
            return None if status == HTTPStatus.OK and '"true"' in body else f"HTTP {status}: {body.strip()}"

        self._wait("etcd", timeout, probe)

    def _wait_apiserver_ready(self, timeout: float) -> None:
        def probe() -> str | None:
            try:
                status, body = http_get(f"{self.server}/readyz", token=self.tokens["admin"], context=self.ssl_context())
            except (OSError, ssl.SSLError) as exc:
                return str(exc)
            return None if status == HTTPStatus.OK else f"HTTP {status}: {' '.join(body.split())[-300:]}"

        self._wait("kube-apiserver", timeout, probe)

    def _wait_controller_manager_ready(self, timeout: float) -> None:
        self._wait(
            "kube-controller-manager",
            timeout,
            lambda: None if self.controller_manager_healthy() else f"{self.controller_manager_health} not 200",
        )

    def _to_json(self) -> dict[str, Any]:
        return {
            "version": 2,
            "server": self.server,
            "etcd_url": self.etcd_url,
            "ca_file": str(self.ca_file),
            "ca_key_file": str(self.ca_key_file),
            "kubeconfigs": {k: str(v) for k, v in self.kubeconfigs.items()},
            "tokens": self.tokens,
            "pids": self.pids,
            "logs": {k: str(v) for k, v in self.logs.items()},
            "binaries": {
                "etcd": str(self.binaries.etcd),
                "kube_apiserver": str(self.binaries.kube_apiserver),
                "kubectl": str(self.binaries.kubectl),
                "kube_controller_manager": str(self.binaries.kube_controller_manager),
            },
            "apiserver_args": self.apiserver_args,
            "controller_manager_args": self.controller_manager_args,
            "controller_manager_health": self.controller_manager_health,
            "detached": self.detached,
        }

    def _save(self) -> None:
        host.write_atomic(self.state_dir / STATE_FILE, json.dumps(self._to_json(), indent=2) + "\n", mode=0o600)

    @classmethod
    def load(cls, state_dir: Path) -> ControlPlane:
        """Re-attach to a control plane started earlier (e.g. by ``up``) from
        its state record; processes are not checked. A record of an earlier version (no controller
        manager, a self-signed server) is read far enough to stop it."""
        state_dir = state_dir.resolve()
        try:
            raw = json.loads((state_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise host.ControlPlaneError(f"no control plane state in {state_dir}") from None
        except json.JSONDecodeError as exc:
            raise host.ControlPlaneError(f"corrupt {state_dir / STATE_FILE}: {exc}") from None
        try:
            b = raw["binaries"]
            ca_file = Path(raw["ca_file"])
            return cls(
                state_dir=state_dir,
                server=raw["server"],
                etcd_url=raw["etcd_url"],
                ca_file=ca_file,
                ca_key_file=Path(raw.get("ca_key_file", ca_file.with_suffix(".key"))),
                kubeconfigs={k: Path(v) for k, v in raw["kubeconfigs"].items()},
                tokens=dict(raw["tokens"]),
                pids={k: int(v) for k, v in raw["pids"].items()},
                logs={k: Path(v) for k, v in raw["logs"].items()},
                binaries=Binaries(
                    Path(b["etcd"]),
                    Path(b["kube_apiserver"]),
                    Path(b["kubectl"]),
                    Path(b.get("kube_controller_manager", "")),
                ),
                apiserver_args=list(raw["apiserver_args"]),
                controller_manager_args=list(raw.get("controller_manager_args", [])),
                controller_manager_health=str(raw.get("controller_manager_health", "")),
                detached=bool(raw.get("detached", True)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise host.ControlPlaneError(f"unreadable {state_dir / STATE_FILE}: {exc!r}") from None


__all__ = ["APISERVER_READY_TIMEOUT", "DEFAULT_RBAC_DIR", "IDENTITIES", "PROCESSES", "STATE_FILE"]
__all__ += ["Binaries", "ControlPlane", "Identity", "http_get"]
