#!/usr/bin/env python3
"""A real containerd (with its CRI plugin) and real OCI registries on loopback, for tests and the demo.

Why this exists: the edge pulls images through the CRI ImageService of the node's container
runtime, and what matters (field numbers on the wire, a 401 without credentials, NOT_FOUND for a
missing tag, plain HTTP to a local registry, cancelling a pull) is exactly what a fake would get
wrong. So tests and the demo run a genuine containerd and genuine ``docker-registry`` processes,
each owned (by PID) by whoever started them, everything in one temporary directory:

- containerd (Debian ``containerd``): root, state, socket and the CRI plugin's registry host
  configuration under the state directory, the ``native`` snapshotter (works in any container, no
  overlay mounts), no TCP listener but the CRI streaming server on 127.0.0.1 with a free port, so a
  system containerd (``/run/containerd``) is never touched;
- registries (Debian ``docker-registry``, distribution v2) on ``127.0.0.1:<free port>``, storage in
  the state directory; optionally with htpasswd basic auth (bcrypt, the only hash it accepts,
  made with ``htpasswd -B`` from ``apache2-utils``), or with bearer-token auth (``auth: token``,
  the exchange Docker Hub uses; :class:`TokenAuth` names the token service, which the caller
  runs). containerd reaches them over plain HTTP through
  a ``hosts.toml`` per registry (:meth:`Containerd.allow_plain_http`);
- test images are built from nothing with ``umoci`` and pushed with ``skopeo``: one small layer
  holding a unique file, so every pushed image has its own digest.

Missing Debian packages are installed with apt-get (as root). This file is stdlib-only on purpose
(like ``tools/provision/controlplane.py``, whose process helpers it shares), so the CLI runs without the
virtualenv; the pytest fixtures at the end are defined only where pytest is importable. Usage::

    python3 tools/provision/containerd.py up        # containerd + an open and an authenticated registry
    python3 tools/provision/containerd.py push demo/app:v1 [--auth]
    python3 tools/provision/containerd.py status
    python3 tools/provision/containerd.py env       # shell exports for the running services
    python3 tools/provision/containerd.py down

As a pytest plugin (``pytest_plugins = [..., "tools.provision.containerd"]``) it provides the session
fixtures ``containerd``, ``registry`` and ``auth_registry``.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

try:
    from tools import ports
    from tools.provision import controlplane as _cp
except ModuleNotFoundError:  # run as a script: tools/provision/ is on sys.path, the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools import ports
    from tools.provision import controlplane as _cp

STATE_FILE: Final = "runtime.json"
"""Marker + record of services started by the CLI inside its state directory."""

READY_TIMEOUT: Final = 30.0
SOCKET_PATH_MAX: Final = 107
"""Longest unix socket path Linux accepts (``sun_path`` is 108 bytes with the NUL)."""

_PACKAGES: Final[Mapping[str, str]] = {
    # executable -> Debian package providing it
    "containerd": "containerd",
    "runc": "runc",
    "docker-registry": "docker-registry",
    "skopeo": "skopeo",
    "umoci": "umoci",
    "htpasswd": "apache2-utils",
}

# Snapshotters that need kernel features or tools a test container lacks; loading them only adds
# errors to the log. The CRI plugin is told to use "native".
_DISABLED_PLUGINS: Final = (
    "io.containerd.snapshotter.v1.aufs",
    "io.containerd.snapshotter.v1.btrfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.snapshotter.v1.overlayfs",
    "io.containerd.snapshotter.v1.zfs",
)


class RuntimeServicesError(RuntimeError):
    """Anything that prevents a usable containerd or registry; the message says what and where."""


def _log(message: str) -> None:
    print(f"[containerd] {message}", file=sys.stderr, flush=True)


def default_state_dir() -> Path:
    """State directory of the CLI: ``$NODETASKD_RUNTIME_DIR`` or ``~/.cache/nodetaskd/runtime``."""
    env = os.environ.get("NODETASKD_RUNTIME_DIR")
    return Path(env).expanduser().resolve() if env else _cp.cache_dir() / "runtime"


# --------------------------------------------------------------------------
# Executables
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Tools:
    """Absolute paths of the executables this module runs."""

    containerd: Path
    registry: Path
    skopeo: Path
    umoci: Path
    htpasswd: Path


def ensure_tools() -> Tools:
    """Return the executables, installing the Debian packages that provide missing ones.

    A lock in the cache directory serialises concurrent callers, since two apt-get runs at once
    fail on dpkg's own lock.
    """
    missing = [pkg for exe, pkg in _PACKAGES.items() if _cp._which(exe) is None]
    if missing:
        cache = _cp.cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        with _cp._file_lock(cache / "apt.lock"):
            missing = [pkg for exe, pkg in _PACKAGES.items() if _cp._which(exe) is None]
            try:
                _cp._apt_install(missing)
            except _cp.ControlPlaneError as exc:
                raise RuntimeServicesError(str(exc)) from None
    found = {exe: _cp._which(exe) for exe in _PACKAGES}
    absent = sorted(exe for exe, path in found.items() if path is None)
    if absent:
        raise RuntimeServicesError(f"still not on PATH after installing packages: {', '.join(absent)}")

    def path(exe: str) -> Path:
        found_path = found[exe]
        assert found_path is not None
        return found_path

    return Tools(
        containerd=path("containerd"),
        registry=path("docker-registry"),
        skopeo=path("skopeo"),
        umoci=path("umoci"),
        htpasswd=path("htpasswd"),
    )


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


@dataclass
class _Process:
    """One started server: its PID, log and (when started by this process) its Popen."""

    name: str
    pid: int
    log: Path
    marker: str
    """A string in the server's command line (its config path), so a reused PID is never killed."""
    child: subprocess.Popen[bytes] | None = field(default=None, repr=False, compare=False)

    def alive(self) -> bool:
        if self.child is not None:
            return self.child.poll() is None
        return _cp._pid_is_ours(self.pid, self.marker)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period. Idempotent."""
        try:
            _cp._terminate(self.pid, self.marker, self.child)
        except _cp.ControlPlaneError as exc:
            raise RuntimeServicesError(f"{self.name}: {exc}") from None

    def check_alive(self) -> None:
        if not self.alive():
            code = self.child.returncode if self.child is not None else "?"
            raise RuntimeServicesError(
                f"{self.name} exited with status {code} during start-up; log {self.log}:\n{_cp._tail(self.log)}"
            )


def _spawn(name: str, argv: Sequence[str], *, log: Path, marker: str, detach: bool) -> _Process:
    """Start a server with its output in ``log``; unless detached it dies with this (main) thread."""
    with open(log, "ab") as out:
        out.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting {name}\n".encode())
        out.flush()
        # PDEATHSIG fires when the *thread* that forked exits, so only the main thread may arm it.
        tie = not detach and threading.current_thread() is threading.main_thread()
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_cp._die_with_parent if tie else None,  # noqa: PLW1509 (only a prctl() runs)
        )
    return _Process(name=name, pid=child.pid, log=log, marker=marker, child=child)


def _wait_until(what: str, process: _Process, ready: Callable[[], bool], timeout: float = READY_TIMEOUT) -> None:
    """Poll ``ready()`` until true; fail early if the process dies, with its log tail."""
    deadline = time.monotonic() + timeout
    while True:
        process.check_alive()
        if ready():
            return
        if time.monotonic() >= deadline:
            raise RuntimeServicesError(
                f"{what} not ready after {timeout:.0f}s; log {process.log}:\n{_cp._tail(process.log)}"
            )
        time.sleep(0.05)


def _run(argv: Sequence[str], *, what: str, cwd: Path | None = None) -> str:
    result = subprocess.run(list(argv), cwd=cwd, capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        detail = " ".join((result.stderr.strip() or result.stdout.strip()).split()[-40:]) or "(no output)"
        raise RuntimeServicesError(f"{what} failed (exit {result.returncode}): {detail}")
    return result.stdout


def _prepare_dir(path: Path) -> Path:
    """Create ``path`` or accept it empty; refuse a populated directory (never delete anything)."""
    path = path.expanduser().resolve()
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    if any(path.iterdir()):
        raise RuntimeServicesError(f"refusing to use non-empty directory {path}")
    return path


# --------------------------------------------------------------------------
# containerd
# --------------------------------------------------------------------------


@dataclass
class Containerd:
    """A running containerd whose CRI plugin serves on :attr:`endpoint`."""

    state_dir: Path
    socket: Path
    process: _Process

    @property
    def endpoint(self) -> str:
        """The CRI endpoint, as the kubelet and KubeEdge spell it: ``unix:///…/containerd.sock``."""
        return f"unix://{self.socket}"

    @property
    def hosts_dir(self) -> Path:
        """The CRI plugin's ``config_path``: one ``<host[:port]>/hosts.toml`` per configured registry."""
        return self.state_dir / "certs.d"

    def allow_plain_http(self, host: str) -> None:
        """Make the CRI plugin reach registry ``host`` (``127.0.0.1:PORT``) over plain HTTP.

        containerd reads the hosts directory at every pull, so no restart is needed.
        """
        directory = self.hosts_dir / host
        directory.mkdir(parents=True, exist_ok=True)
        _cp._write_atomic(
            directory / "hosts.toml",
            f'server = "http://{host}"\n\n[host."http://{host}"]\n  capabilities = ["pull", "resolve"]\n',
        )

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self) -> None:
        """Stop containerd (by PID). Idempotent."""
        self.process.stop()


def _containerd_config(state_dir: Path, sock: Path) -> str:
    # TOML basic strings are JSON-compatible for these paths, so json.dumps quotes them safely.
    def q(value: object) -> str:
        return json.dumps(str(value))

    disabled = ", ".join(q(p) for p in _DISABLED_PLUGINS)
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f"root = {q(state_dir / 'root')}",
            f"state = {q(state_dir / 'state')}",
            f"disabled_plugins = [{disabled}]",
            "[grpc]",
            f"  address = {q(sock)}",
            "[ttrpc]",
            f"  address = {q(str(sock) + '.ttrpc')}",
            '[plugins."io.containerd.internal.v1.opt"]',
            f"  path = {q(state_dir / 'opt')}",
            f"{cri}]",
            # Never pulled (no pod is run); a loopback name keeps anything from reaching the internet.
            '  sandbox_image = "127.0.0.1:1/pause:none"',
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"{cri}.containerd]",
            '  snapshotter = "native"',
            f"{cri}.cni]",
            f"  bin_dir = {q(state_dir / 'cni' / 'bin')}",
            f"  conf_dir = {q(state_dir / 'cni' / 'conf')}",
            f"{cri}.registry]",
            f"  config_path = {q(state_dir / 'certs.d')}",
            "",
        ]
    )


def start_containerd(state_dir: Path, tools: Tools | None = None, *, detach: bool = False) -> Containerd:
    """Start containerd with everything in ``state_dir`` (created, or empty); return once it serves.

    With ``detach=False`` (tests) the kernel also terminates it if the calling process dies
    without :meth:`Containerd.stop`; ``detach=True`` (the CLI's ``up``) lets it outlive the caller.
    """
    tools = tools or ensure_tools()
    state_dir = _prepare_dir(state_dir)
    sock = state_dir / "containerd.sock"
    if len(str(sock)) + len(".ttrpc") > SOCKET_PATH_MAX:
        raise RuntimeServicesError(f"socket path {sock}.ttrpc is longer than {SOCKET_PATH_MAX} bytes")
    for sub in ("certs.d", "cni/bin", "cni/conf", "opt"):
        (state_dir / sub).mkdir(parents=True)
    config = state_dir / "config.toml"
    _cp._write_atomic(config, _containerd_config(state_dir, sock))
    log = state_dir / "containerd.log"
    process = _spawn(
        "containerd",
        [str(tools.containerd), "--config", str(config)],
        log=log,
        marker=str(config),
        detach=detach,
    )
    ctd = Containerd(state_dir=state_dir, socket=sock, process=process)
    try:
        _wait_until("containerd", process, lambda: _booted(log) and _accepts(sock))
    except BaseException:
        with contextlib.suppress(RuntimeServicesError):
            ctd.stop()
        raise
    return ctd


def _booted(log: Path) -> bool:
    # The CRI service is registered before containerd logs this line.
    return "containerd successfully booted" in log.read_text(errors="replace")


def _accepts(sock: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(sock))
        except OSError:
            return False
    return True


# --------------------------------------------------------------------------
# Registries
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class TokenAuth:
    """A registry's ``auth: token`` settings: the token service its 401 challenges send clients to.

    The registry only verifies tokens: each is a JWT whose signing certificate chains to
    :attr:`rootcertbundle`, issued by :attr:`issuer` for audience :attr:`service`.
    """

    realm: str
    """The token service's URL, e.g. ``http://127.0.0.1:PORT/token``."""
    service: str
    issuer: str
    rootcertbundle: Path
    """PEM certificate(s) the token signatures must chain to."""


@dataclass
class Registry:
    """A running ``docker-registry`` on :attr:`host`, optionally requiring basic auth or bearer tokens."""

    state_dir: Path
    host: str
    """``127.0.0.1:PORT``; images are ``{host}/{name}:{tag}``."""
    process: _Process
    tools: Tools | None = field(default=None, repr=False)
    """What :meth:`push` runs (found, or installed, when first needed if None)."""
    username: str = ""
    password: str = field(default="", repr=False)
    token_auth: TokenAuth | None = None

    @property
    def requires_auth(self) -> bool:
        return bool(self.username)

    def docker_config_json(self) -> str:
        """A ``.dockerconfigjson`` document with this registry's credentials (``{"auths": {...}}``)."""
        token = base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        return json.dumps({"auths": {self.host: {"auth": token}}})

    def push(self, name: str, tag: str = "latest", *, content: bytes | None = None) -> str:
        """Build a one-layer image holding ``content`` (default: unique bytes) and push it as ``name:tag``.

        Returns the image reference ``{host}/{name}:{tag}``. Every call makes a new digest unless
        ``content`` repeats.
        """
        tools = self.tools = self.tools or ensure_tools()
        work = self.state_dir / "images"
        layout = work / "oci"
        policy = work / "policy.json"
        if not layout.exists():
            work.mkdir(exist_ok=True)
            # skopeo insists on a signature policy; ours accepts anything, and so never reads /etc.
            _cp._write_atomic(policy, json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
            _run([str(tools.umoci), "init", "--layout", str(layout)], what="umoci init")
        local = f"img-{secrets.token_hex(6)}"  # umoci tags are local and must be unique
        payload = work / f"{local}.txt"
        payload.write_bytes(content if content is not None else f"{name}:{tag} {secrets.token_hex(16)}\n".encode())
        image = f"{layout}:{local}"
        _run([str(tools.umoci), "new", "--image", image], what="umoci new")
        _run([str(tools.umoci), "insert", "--image", image, str(payload), "/nodetaskd.txt"], what="umoci insert")
        ref = f"{self.host}/{name}:{tag}"
        argv = [str(tools.skopeo), "--policy", str(policy), "copy", "--quiet", "--dest-tls-verify=false"]
        if self.requires_auth:
            argv.append(f"--dest-creds={self.username}:{self.password}")
        _run([*argv, f"oci:{image}", f"docker://{ref}"], what=f"skopeo copy to {ref}")
        payload.unlink()
        return ref

    def alive(self) -> bool:
        return self.process.alive()

    def stop(self) -> None:
        """Stop the registry (by PID). Idempotent."""
        self.process.stop()


def start_registry(
    state_dir: Path,
    tools: Tools | None = None,
    *,
    credentials: tuple[str, str] | None = None,
    token_auth: TokenAuth | None = None,
    detach: bool = False,
) -> Registry:
    """Start a registry on 127.0.0.1 with its storage in ``state_dir``; return once ``/v2/`` answers.

    With ``credentials`` every request needs basic auth as that user (htpasswd, bcrypt); with
    ``token_auth`` a bearer token from that token service (the registry logs why it refuses one).
    """
    if credentials is not None and token_auth is not None:
        raise RuntimeServicesError("a registry takes basic credentials or token auth, not both")
    tools = tools or ensure_tools()
    state_dir = _prepare_dir(state_dir)
    port = ports.free_port()
    host = f"127.0.0.1:{port}"
    config: dict[str, object] = {
        "version": "0.1",
        "log": {"level": "warn", "accesslog": {"disabled": True}},
        "storage": {"filesystem": {"rootdirectory": str(state_dir / "data")}, "delete": {"enabled": True}},
        # A fixed secret silences the "generated random secret" warning; it only signs upload state.
        "http": {"addr": host, "secret": secrets.token_hex(16)},
    }
    username = password = ""
    if credentials is not None:
        username, password = credentials
        htpasswd = state_dir / "htpasswd"
        line = _run(
            [str(tools.htpasswd), "-B", "-b", "-n", username, password], what="htpasswd -B"
        ).strip()  # bcrypt: the only hash distribution's htpasswd auth accepts
        _cp._write_atomic(htpasswd, line + "\n", mode=0o600)
        config["auth"] = {"htpasswd": {"realm": "nodetaskd-test", "path": str(htpasswd)}}
    if token_auth is not None:
        config["auth"] = {
            "token": {
                "realm": token_auth.realm,
                "service": token_auth.service,
                "issuer": token_auth.issuer,
                "rootcertbundle": str(token_auth.rootcertbundle),
            }
        }
    config_path = state_dir / "config.yml"
    _cp._write_atomic(config_path, json.dumps(config, indent=2) + "\n")  # JSON is YAML
    process = _spawn(
        "docker-registry",
        [str(tools.registry), "serve", str(config_path)],
        log=state_dir / "registry.log",
        marker=str(config_path),
        detach=detach,
    )
    registry = Registry(
        state_dir=state_dir,
        host=host,
        process=process,
        tools=tools,
        username=username,
        password=password,
        token_auth=token_auth,
    )
    try:
        _wait_until(f"docker-registry on {host}", process, lambda: _registry_answers(host))
    except BaseException:
        with contextlib.suppress(RuntimeServicesError):
            registry.stop()
        raise
    return registry


def _registry_answers(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/v2/", timeout=2) as resp:
            return int(resp.status) == 200
    except urllib.error.HTTPError as exc:
        return exc.code == 401  # alive, and asking for credentials
    except OSError:
        return False


# --------------------------------------------------------------------------
# The CLI: services that outlive the command, recorded in a state file
# --------------------------------------------------------------------------


def _record(state_dir: Path, ctd: Containerd, open_reg: Registry, auth_reg: Registry) -> None:
    def proc(p: _Process) -> dict[str, object]:
        return {"pid": p.pid, "log": str(p.log), "marker": p.marker}

    record = {
        "endpoint": ctd.endpoint,
        "containerd": proc(ctd.process),
        "registry": {"host": open_reg.host, **proc(open_reg.process)},
        "auth_registry": {
            "host": auth_reg.host,
            "username": auth_reg.username,
            "password": auth_reg.password,
            **proc(auth_reg.process),
        },
    }
    _cp._write_atomic(state_dir / STATE_FILE, json.dumps(record, indent=2) + "\n", mode=0o600)


def _load(state_dir: Path, tools: Tools | None) -> tuple[Containerd, Registry, Registry]:
    try:
        raw = json.loads((state_dir / STATE_FILE).read_text())

        def proc(name: str, entry: dict[str, object]) -> _Process:
            return _Process(
                name=name, pid=int(str(entry["pid"])), log=Path(str(entry["log"])), marker=str(entry["marker"])
            )

        ctd = Containerd(
            state_dir=state_dir / "containerd",
            socket=Path(str(raw["endpoint"]).removeprefix("unix://")),
            process=proc("containerd", raw["containerd"]),
        )
        regs = [
            Registry(
                state_dir=state_dir / key,
                host=str(raw[key]["host"]),
                process=proc(key, raw[key]),
                tools=tools,
                username=str(raw[key].get("username", "")),
                password=str(raw[key].get("password", "")),
            )
            for key in ("registry", "auth_registry")
        ]
    except FileNotFoundError:
        raise RuntimeServicesError(f"nothing recorded in {state_dir} (run `up` first)") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise RuntimeServicesError(f"unreadable {state_dir / STATE_FILE}: {exc!r}") from None
    return ctd, regs[0], regs[1]


def _stop_all(state_dir: Path) -> None:
    ctd, open_reg, auth_reg = _load(state_dir, None)
    errors: list[str] = []
    for service in (ctd, open_reg, auth_reg):
        try:
            service.stop()
        except RuntimeServicesError as exc:
            errors.append(str(exc))
    if errors:
        raise RuntimeServicesError("; ".join(errors))
    (state_dir / STATE_FILE).unlink()


def _cmd_up(state_dir: Path) -> int:
    if (state_dir / STATE_FILE).exists():
        ctd, open_reg, auth_reg = _load(state_dir, None)
        if ctd.alive() and open_reg.alive() and auth_reg.alive():
            _log(f"already running (state {state_dir})")
            return _cmd_env(state_dir)
        _stop_all(state_dir)  # half-dead leftovers
    if state_dir.exists():
        # Only our own sub-directories are ever removed, and only with our state file gone.
        for sub in ("containerd", "registry", "auth_registry"):
            if (state_dir / sub).is_dir():
                shutil.rmtree(state_dir / sub)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    tools = ensure_tools()
    started = time.monotonic()
    ctd = start_containerd(state_dir / "containerd", tools, detach=True)
    try:
        open_reg = start_registry(state_dir / "registry", tools, detach=True)
        auth_reg = start_registry(
            state_dir / "auth_registry", tools, credentials=("nodetaskd", secrets.token_urlsafe(12)), detach=True
        )
    except BaseException:
        ctd.stop()
        raise
    for reg in (open_reg, auth_reg):
        ctd.allow_plain_http(reg.host)
    _cp._write_atomic(state_dir / "auth_registry.dockerconfigjson", auth_reg.docker_config_json() + "\n", mode=0o600)
    _record(state_dir, ctd, open_reg, auth_reg)
    _log(f"started in {time.monotonic() - started:.1f}s (state and logs in {state_dir})")
    return _cmd_env(state_dir)


def _cmd_env(state_dir: Path) -> int:
    ctd, open_reg, auth_reg = _load(state_dir, None)
    print(f"export NODETASKD_CRI_ENDPOINT={shlex.quote(ctd.endpoint)}")
    print(f"export NODETASKD_REGISTRY={shlex.quote(open_reg.host)}")
    print(f"export NODETASKD_AUTH_REGISTRY={shlex.quote(auth_reg.host)}")
    dockerconfig = state_dir / "auth_registry.dockerconfigjson"
    print(f"export NODETASKD_AUTH_REGISTRY_DOCKERCONFIGJSON={shlex.quote(str(dockerconfig))}")
    return 0


def _cmd_status(state_dir: Path) -> int:
    try:
        services = _load(state_dir, None)
    except RuntimeServicesError as exc:
        print(f"not running: {exc}")
        return 1
    ctd, open_reg, auth_reg = services
    rows = [
        ("containerd", ctd.process, ctd.endpoint),
        *((r.process.name, r.process, r.host) for r in (open_reg, auth_reg)),
    ]
    ok = True
    for name, process, where in rows:
        alive = process.alive()
        ok = ok and alive
        print(f"{name}: pid {process.pid} {'alive' if alive else 'DEAD'} at {where}, log {process.log}")
    return 0 if ok else 1


def _cmd_down(state_dir: Path) -> int:
    if not (state_dir / STATE_FILE).exists():
        _log(f"nothing to stop (no state in {state_dir})")
        return 0
    _stop_all(state_dir)
    _log("stopped")
    return 0


def _cmd_push(state_dir: Path, ref: str, *, auth: bool) -> int:
    name, tag = ref.rsplit(":", 1) if ":" in ref.rsplit("/", 1)[-1] else (ref, "latest")
    _, open_reg, auth_reg = _load(state_dir, ensure_tools())
    print((auth_reg if auth else open_reg).push(name, tag))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="containerd.py",
        description="A real containerd (CRI) and docker-registry on 127.0.0.1 for tests and demos.",
    )
    parser.add_argument("command", choices=("up", "down", "status", "env", "push"))
    parser.add_argument("image", nargs="?", help="push: NAME[:TAG] to build and push")
    parser.add_argument("--auth", action="store_true", help="push: to the registry that needs credentials")
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state directory (default: $NODETASKD_RUNTIME_DIR or ~/.cache/nodetaskd/runtime)",
    )
    args = parser.parse_args(argv)
    state_dir: Path = (args.state_dir or default_state_dir()).expanduser().resolve()
    try:
        if args.command == "push":
            if not args.image:
                parser.error("push needs an image NAME[:TAG]")
            return _cmd_push(state_dir, args.image, auth=args.auth)
        commands = {"up": _cmd_up, "down": _cmd_down, "status": _cmd_status, "env": _cmd_env}
        return commands[args.command](state_dir)
    except RuntimeServicesError as exc:
        print(f"containerd: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


# --------------------------------------------------------------------------
# pytest plugin
# --------------------------------------------------------------------------

try:
    import pytest
except ModuleNotFoundError:  # the CLI runs without the virtualenv; only the fixtures need pytest
    pass
else:

    @pytest.fixture(scope="session")
    def runtime_tools() -> Tools:
        """The Debian tools, installed on first use (containerd, docker-registry, skopeo, umoci, htpasswd)."""
        return ensure_tools()

    @pytest.fixture(scope="session")
    def containerd(tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools) -> Iterator[Containerd]:
        """A containerd with its CRI plugin at ``containerd.endpoint``, stopped (by PID) after the session."""
        ctd = start_containerd(tmp_path_factory.mktemp("containerd"), runtime_tools)
        try:
            yield ctd
        finally:
            ctd.stop()

    @pytest.fixture(scope="session")
    def registry(
        tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools, containerd: Containerd
    ) -> Iterator[Registry]:
        """An open registry on 127.0.0.1 that ``containerd`` pulls from over plain HTTP."""
        reg = start_registry(tmp_path_factory.mktemp("registry"), runtime_tools)
        try:
            containerd.allow_plain_http(reg.host)
            yield reg
        finally:
            reg.stop()

    @pytest.fixture(scope="session")
    def auth_registry(
        tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools, containerd: Containerd
    ) -> Iterator[Registry]:
        """A registry that needs basic auth (``.username``/``.password``), reachable by ``containerd``."""
        reg = start_registry(
            tmp_path_factory.mktemp("auth-registry"),
            runtime_tools,
            credentials=("nodetaskd", secrets.token_urlsafe(12)),
        )
        try:
            containerd.allow_plain_http(reg.host)
            yield reg
        finally:
            reg.stop()


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "READY_TIMEOUT",
    "Containerd",
    "Registry",
    "RuntimeServicesError",
    "TokenAuth",
    "Tools",
    "default_state_dir",
    "ensure_tools",
    "main",
    "start_containerd",
    "start_registry",
]
