#!/usr/bin/env python3
"""A real kube-apiserver + etcd on loopback, for tests and the demo.

Why this exists: nodetaskd talks to Kubernetes through CRDs, the status
subresource, optimistic concurrency (409 on a stale resourceVersion), watches
and RBAC.  Fakes get those details subtly wrong, so tests and the demo run
against a genuine kube-apiserver backed by a genuine etcd, both bound to
127.0.0.1 and owned (by PID) by whoever started them.

Where the binaries come from: Debian bookworm ships etcd (``etcd-server``) but
no kube-apiserver package, only the ``kubernetes`` *source* package (1.20.2).
:func:`ensure_binaries` fetches that source with a private apt configuration
(the system's sources are never edited), swaps in a vendored ``reflect2`` that
works under Go >= 1.18, patches kube-openapi's type validator so that it
accepts empty strings under Go >= 1.16, builds ``cmd/kube-apiserver`` once with
Debian's Go, and caches the binary outside the repository.  Everything comes from the
Debian archive, so it works on machines that can only reach Debian and PyPI.

This file is stdlib-only on purpose (like ``tools/ports.py``, which picks its
servers' ports): it must run before (or without) the project's virtualenv.  Usage::

    python3 tools/provision/controlplane.py up      # build if needed, start, apply RBAC
    python3 tools/provision/controlplane.py status
    python3 tools/provision/controlplane.py env     # shell exports for the running cluster
    python3 tools/provision/controlplane.py down

It is also importable (see ``tests/integration/controlplane.py``)::

    cp = start(state_dir, ensure_binaries())
    try:
        cp.apply_rbac()
        ...
    finally:
        cp.stop()
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import errno
import fcntl
import functools
import json
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Final

try:
    from tools import ports
except ModuleNotFoundError:  # run as a script: tools/provision/ is on sys.path, the repository root is not
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools import ports

KUBERNETES_VERSION: Final = "1.20.2"
"""Upstream version inside Debian bookworm's ``kubernetes`` source package."""

APISERVER_BUILD_REVISION: Final = 2
"""Bumped whenever :func:`_build_apiserver` changes what it builds, so that a
binary cached by an older (broken) revision is never picked up again.
1: reflect2 swap only (empty strings in custom resources were rejected as null);
2: plus the kube-openapi zero-value fix."""

DEBIAN_SUITE: Final = "bookworm"
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"

REPO_ROOT: Final = Path(__file__).resolve().parents[2]
DEFAULT_RBAC_DIR: Final = REPO_ROOT / "containers" / "rbac"
WEBHOOK_REGISTRATION_RBAC: Final = DEFAULT_RBAC_DIR / "webhook-registration"
"""Applied here besides the roles' RBAC: the controllers run outside this control plane, where no
manifest creates their webhook configurations, so they create them (``containers/deploy`` ships them)."""

STATE_FILE: Final = "controlplane.json"
"""Marker + record of a started control plane inside its state directory."""

APISERVER_READY_TIMEOUT: Final = 90.0
ETCD_READY_TIMEOUT: Final = 30.0
STOP_GRACE: Final = 10.0
"""Seconds between SIGTERM and SIGKILL when stopping a process."""

HEARTBEAT_SECONDS: Final = 15.0


class ControlPlaneError(RuntimeError):
    """Anything that prevents a usable control plane; the message is one line
    (plus, for start-up failures, the tail of the relevant log)."""


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
"""Users and groups the RBAC manifests in ``containers/rbac`` bind to.  Tokens
are random per start; a kubeconfig is written for each identity."""


def _log(message: str) -> None:
    print(f"[controlplane] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where built binaries live: ``$NODETASKD_CACHE`` or ``~/.cache/nodetaskd``.

    Outside the repository so that ``git clean`` does not cost a rebuild and
    the 100+ MB binary never ends up in a commit."""
    env = os.environ.get("NODETASKD_CACHE")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "nodetaskd"


def default_cluster_dir() -> Path:
    """State directory used by the CLI: ``$NODETASKD_CLUSTER_DIR`` or
    ``~/.cache/nodetaskd/cluster``."""
    env = os.environ.get("NODETASKD_CLUSTER_DIR")
    return Path(env).expanduser().resolve() if env else Path.home() / ".cache" / "nodetaskd" / "cluster"


def apiserver_binary_path() -> Path:
    """The cached binary; its name carries :data:`APISERVER_BUILD_REVISION`."""
    return cache_dir() / f"kube-apiserver-{KUBERNETES_VERSION}-{APISERVER_BUILD_REVISION}"


def _write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """Write via a temp file in the same directory + rename, so readers never
    see a half-written kubeconfig, token file or state record."""
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# --------------------------------------------------------------------------
# Binaries
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the executables a control plane needs."""

    etcd: Path
    kube_apiserver: Path
    kubectl: Path


_RUNTIME_PACKAGES: Final[Mapping[str, str]] = {
    # executable -> Debian package providing it.  Checked by executable, not by
    # package, because e.g. kubectl may come from another vendor's package and
    # installing kubernetes-client over it would be a file conflict.
    "etcd": "etcd-server",
    "kubectl": "kubernetes-client",
    "openssl": "openssl",
}
_BUILD_PACKAGES: Final = (
    "golang-go",
    "make",
    "rsync",
    "dpkg-dev",
    "golang-github-modern-go-reflect2-dev",
)
_REFLECT2_SRC: Final = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")

_OPENAPI_TYPE_VALIDATOR: Final = Path("vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go")
_OPENAPI_ZERO_CHECK: Final = (
    "if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {"
)
_OPENAPI_NIL_CHECK: Final = "if data == nil {"


def _which(name: str) -> Path | None:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    return Path(found) if found else None


def _dpkg_installed(package: str) -> bool:
    result = subprocess.run(
        ["dpkg-query", "-W", "-f=${Status}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip().endswith(" installed")


def _apt_env() -> dict[str, str]:
    return {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}


@functools.cache
def _apt_update() -> None:
    """``apt-get update``, at most once per process (cached)."""
    _log("apt-get update")
    _run_quiet(["apt-get", "update", "-qq"], env=_apt_env(), what="apt-get update")


def _apt_install(packages: Sequence[str]) -> None:
    """Install Debian packages (``apt-get update`` once per process first)."""
    if not packages:
        return
    if os.geteuid() != 0:
        raise ControlPlaneError(
            f"missing Debian packages {' '.join(packages)}; run as root or `sudo apt-get install {' '.join(packages)}`"
        )
    _apt_update()
    _log(f"apt-get install {' '.join(packages)}")
    _run_quiet(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        env=_apt_env(),
        what=f"apt-get install {' '.join(packages)}",
    )


def _run_quiet(
    argv: Sequence[str],
    *,
    what: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a command, capturing output; on failure raise with its last line."""
    result = subprocess.run(
        list(argv),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
        last = lines[-1] if lines else "(no output)"
        raise ControlPlaneError(f"{what} failed (exit {result.returncode}): {last}")
    return result.stdout


def ensure_binaries() -> Binaries:
    """Return etcd, kube-apiserver and kubectl, installing/building what is missing.

    Fast path (everything present) takes milliseconds and no lock.  Otherwise a
    lock file in the cache directory serialises concurrent callers (parallel
    test sessions, ``up`` racing a test run), and whoever waited re-checks
    before doing anything, so the ~5 minute build happens once per machine.
    """
    binary = apiserver_binary_path()
    missing_runtime = [pkg for exe, pkg in _RUNTIME_PACKAGES.items() if _which(exe) is None]
    if not missing_runtime and _binary_usable(binary):
        return _binaries(binary)

    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with _file_lock(cache / f"kube-apiserver-{KUBERNETES_VERSION}.lock"):
        _apt_install([pkg for exe, pkg in _RUNTIME_PACKAGES.items() if _which(exe) is None])
        if not _binary_usable(binary):
            _apt_install([pkg for pkg in _BUILD_PACKAGES if not _dpkg_installed(pkg)])
            _build_apiserver(binary)
    return _binaries(binary)


def _binaries(apiserver: Path) -> Binaries:
    etcd, kubectl = _which("etcd"), _which("kubectl")
    if etcd is None or kubectl is None:
        raise ControlPlaneError("etcd or kubectl still not on PATH after installing packages")
    return Binaries(etcd=etcd, kube_apiserver=apiserver, kubectl=kubectl)


def _binary_usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive flock; says so on stderr when it has to wait for another process."""
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _log(f"waiting for another process holding {path} (probably building kube-apiserver)")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _system_mirror() -> tuple[str, str | None]:
    """(URI, signed-by keyring) of the system's Debian ``bookworm`` main source.

    Reusing the system's mirror matters on machines that may only reach a
    specific (e.g. internal or snapshot) mirror."""
    apt = Path("/etc/apt")
    candidates = sorted((apt / "sources.list.d").glob("*.sources"))
    for path in candidates:
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if (
                DEBIAN_SUITE in fields.get("suites", "").split()
                and "main" in fields.get("components", "").split()
                and fields.get("uris")
            ):
                return fields["uris"].split()[0], fields.get("signed-by")
    lists = [apt / "sources.list", *sorted((apt / "sources.list.d").glob("*.list"))]
    pattern = re.compile(r"^deb(?:-src)?\s+(?:\[(?P<opts>[^\]]*)\]\s+)?(?P<uri>\S+)\s+(?P<suite>\S+)\s+(?P<comps>.*)$")
    for path in lists:
        if not path.is_file():
            continue
        for line in path.read_text(errors="replace").splitlines():
            m = pattern.match(line.strip())
            if m and m["suite"] == DEBIAN_SUITE and "main" in m["comps"].split():
                opts = dict(o.split("=", 1) for o in (m["opts"] or "").split() if "=" in o)
                return m["uri"], opts.get("signed-by")
    return DEFAULT_MIRROR, None


def _build_apiserver(target: Path) -> None:
    """Fetch Debian's kubernetes source, patch it for Go 1.19, build, install atomically.

    The work tree lives in the cache directory (``build/``); it is wiped before
    a build and removed after a successful one.  On failure it is kept and the
    error names the full log."""
    work = target.parent / "build"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log_path = work / "build.log"
    started = time.monotonic()

    # Private apt configuration: a deb-src line for bookworm main only, with
    # its own lists and cache, so the system's apt state is left untouched.
    uri, signed_by = _system_mirror()
    apt_dir = work / "apt"
    (apt_dir / "lists" / "partial").mkdir(parents=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True)
    options = f"[signed-by={signed_by}] " if signed_by else ""
    (apt_dir / "sources.list").write_text(f"deb-src {options}{uri} {DEBIAN_SUITE} main\n")
    apt_opts = [
        f"-oDir::Etc::SourceList={apt_dir / 'sources.list'}",
        "-oDir::Etc::SourceParts=/dev/null",
        f"-oDir::State::Lists={apt_dir / 'lists'}",
        f"-oDir::Cache={apt_dir / 'cache'}",
    ]
    if os.geteuid() == 0:
        # The work dir is under root's home, which the _apt sandbox user
        # cannot write; downloading as root avoids a warning per file.
        apt_opts.append("-oAPT::Sandbox::User=root")
    _log(f"fetching Debian source package 'kubernetes' from {uri} ({DEBIAN_SUITE})")
    _run_quiet(["apt-get", *apt_opts, "update", "-qq"], what="apt-get update (deb-src)")
    src_dl = work / "download"
    src_dl.mkdir()
    _run_quiet(
        ["apt-get", *apt_opts, "source", "--download-only", "kubernetes"],
        cwd=src_dl,
        what="apt-get source kubernetes",
    )
    dscs = sorted(src_dl.glob("kubernetes_*.dsc"))
    if len(dscs) != 1:
        raise ControlPlaneError(f"expected one kubernetes_*.dsc in {src_dl}, found {len(dscs)}")
    if f"really{KUBERNETES_VERSION}" not in dscs[0].name and KUBERNETES_VERSION not in dscs[0].name:
        raise ControlPlaneError(f"Debian source {dscs[0].name} is not Kubernetes {KUBERNETES_VERSION}")
    tree = work / "kubernetes"
    _log(f"unpacking {dscs[0].name}")
    _run_quiet(["dpkg-source", "-x", str(dscs[0]), str(tree)], what="dpkg-source -x")
    for dsc_file in src_dl.iterdir():  # tarballs are no longer needed; save ~35 MB
        dsc_file.unlink()

    # reflect2 v1.0.1 reads Go map internals that changed in Go 1.18; the
    # apiserver then dies with "fatal error: fault" the first time it encodes a
    # custom resource.  1.0.2 (API-compatible) fixes that.
    vendored = tree / "vendor" / "github.com" / "modern-go" / "reflect2"
    if not _REFLECT2_SRC.is_dir():
        raise ControlPlaneError(f"{_REFLECT2_SRC} missing; install golang-github-modern-go-reflect2-dev")
    shutil.rmtree(vendored)
    shutil.copytree(_REFLECT2_SRC, vendored, symlinks=False)
    # A go.mod inside vendor/ would split the directory off as its own module.
    (vendored / "go.mod").unlink(missing_ok=True)
    _patch_openapi_zero_check(tree)

    # The kubernetes 1.20 build scripts expect a GOPATH with the tree at
    # k8s.io/kubernetes (what debian/rules sets up).
    gopath = tree / ".go"
    (gopath / "src" / "k8s.io").mkdir(parents=True)
    (gopath / "src" / "k8s.io" / "kubernetes").symlink_to(Path("../../.."))
    env = {
        **os.environ,
        "GOPATH": str(gopath),
        "CGO_ENABLED": "0",
        "PATH": f"/usr/lib/go/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GOFLAGS": "",
    }
    _log(f"building kube-apiserver {KUBERNETES_VERSION} (about 5 minutes on 2 cores; full log: {log_path})")
    _stream_build(
        ["make", "WHAT=cmd/kube-apiserver"],
        cwd=gopath / "src" / "k8s.io" / "kubernetes",
        env=env,
        log_path=log_path,
        started=started,
    )

    built = (tree / "_output" / "bin" / "kube-apiserver").resolve()
    if not built.is_file():
        raise ControlPlaneError(f"build finished but {built} does not exist; see {log_path}")
    version = _run_quiet([str(built), "--version"], what="kube-apiserver --version").strip()
    if version != f"Kubernetes v{KUBERNETES_VERSION}":
        raise ControlPlaneError(f"built binary reports {version!r}, expected Kubernetes v{KUBERNETES_VERSION}")
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        shutil.copyfile(built, tmp)
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    shutil.rmtree(work, ignore_errors=True)
    _log(f"kube-apiserver built in {_fmt_elapsed(time.monotonic() - started)}, cached at {target}")


def _patch_openapi_zero_check(tree: Path) -> None:
    """Make kube-openapi's type validator treat only ``nil`` as null.

    Its check ``reflect.DeepEqual(reflect.Zero(T), reflect.ValueOf(data))``
    compares two ``reflect.Value`` headers, which never matched before Go 1.16.
    Since Go 1.16 ``reflect.Zero`` and the runtime's conversion of ``""`` to
    ``interface{}`` both point at the same shared zero buffer, so every empty
    string in a custom resource fails schema validation with
    ``Invalid value: "null": ... must be of type string``.  This is
    kubernetes/kubernetes#99804, fixed in Kubernetes 1.21 by
    kubernetes/kube-openapi#230 (the same one-line change as here).  The
    ``go-openapi/validate`` copy in vendor/ has the same line but is not
    linked into kube-apiserver."""
    path = tree / _OPENAPI_TYPE_VALIDATOR
    try:
        source = path.read_text()
    except FileNotFoundError:
        raise ControlPlaneError(f"{path} missing; cannot apply the kube-openapi zero-value fix") from None
    if source.count(_OPENAPI_ZERO_CHECK) != 1:
        raise ControlPlaneError(f"{path}: expected exactly one {_OPENAPI_ZERO_CHECK!r}; source changed?")
    path.write_text(source.replace(_OPENAPI_ZERO_CHECK, _OPENAPI_NIL_CHECK))


def _fmt_elapsed(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s"


def _stream_build(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    started: float,
) -> None:
    """Run the build, full output to ``log_path``, a condensed view to stderr.

    The build script announces each Go target it builds; those are echoed as
    one line each with the elapsed time.  Compiling kube-apiserver itself is
    a single silent step of several minutes, so a heartbeat thread prints the
    elapsed time whenever nothing was printed for 15 s, so nobody mistakes the
    build for a hang.  On failure the last lines are echoed too."""
    done = threading.Event()
    last_print = [time.monotonic()]

    def say(message: str) -> None:
        last_print[0] = time.monotonic()
        _log(f"  {_fmt_elapsed(last_print[0] - started)} {message}")

    def heartbeat() -> None:
        while not done.wait(max(0.0, last_print[0] + HEARTBEAT_SECONDS - time.monotonic())):
            if time.monotonic() - last_print[0] >= HEARTBEAT_SECONDS:
                say("... still compiling")

    ticker = threading.Thread(target=heartbeat, name="build-heartbeat", daemon=True)
    tail: list[str] = []
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        ticker.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.write(line)
                tail = [*tail[-14:], line.rstrip()]
                stripped = line.strip()
                if stripped.startswith(("./", "cmd/")):
                    say(f"go build {stripped}")
                elif stripped.startswith(("+++", "!!!")) and "Building go targets" not in stripped:
                    say(re.sub(r"^[+!]{3} \[[^]]*\] ", "", stripped))
            rc = proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        finally:
            done.set()
            ticker.join()
    if rc != 0:
        for line in tail:
            _log(f"  | {line}")
        last = next((t for t in reversed(tail) if t.strip()), "(no output)")
        raise ControlPlaneError(f"kube-apiserver build failed (exit {rc}): {last.strip()} -- full log: {log_path}")


# --------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------


def _proc_state(pid: int) -> str | None:
    """Kernel state letter of ``pid`` (``None`` if it does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rpartition(")")[2].split()[0]


def _pid_is_ours(pid: int, marker: str) -> bool:
    """Whether ``pid`` is alive and its command line mentions ``marker`` (the
    state directory).  Guards against killing an unrelated process that reused
    a PID recorded in a stale state file."""
    if pid <= 0 or _proc_state(pid) in (None, "Z", "X"):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    return marker in cmdline


def _wait_exit(pid: int, timeout: float, child: subprocess.Popen[bytes] | None) -> bool:
    """Wait (without spinning) up to ``timeout`` for ``pid`` to exit."""
    if child is not None:
        try:
            child.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            return True
        pidfd = -1
    if pidfd >= 0:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            return bool(poller.poll(timeout * 1000))
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + timeout  # no pidfd support: poll /proc gently
    while _proc_state(pid) not in (None, "Z", "X"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def _terminate(pid: int, marker: str, child: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM, wait up to :data:`STOP_GRACE`, then SIGKILL and wait again."""
    if child is not None and child.poll() is not None:
        return
    if child is None and not _pid_is_ours(pid, marker):
        return
    for sig, grace in ((signal.SIGTERM, STOP_GRACE), (signal.SIGKILL, STOP_GRACE)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            break
        if _wait_exit(pid, grace, child):
            break
    else:
        raise ControlPlaneError(f"process {pid} survived SIGKILL for {STOP_GRACE:.0f}s")
    if child is not None:
        child.wait()


_PR_SET_PDEATHSIG: Final = 1


def _die_with_parent() -> None:
    """preexec_fn: have the kernel SIGTERM the child if our (main) thread dies,
    so a test run killed with SIGKILL does not leak etcd/kube-apiserver."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)


def _tail(path: Path, lines: int = 25) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _http_get(url: str, *, token: str | None = None, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as resp:
            return int(resp.status), resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


# --------------------------------------------------------------------------
# The control plane
# --------------------------------------------------------------------------


@dataclass
class ControlPlane:
    """A running etcd + kube-apiserver pair on 127.0.0.1.

    ``kubeconfigs``/``tokens`` are keyed by identity name (see
    :data:`IDENTITIES`: admin, controller, cloud, edge).  The serving
    certificate is self-signed by kube-apiserver into ``state_dir/pki`` and
    kept across :meth:`restart_apiserver`, so clients need no reconfiguring.
    """

    state_dir: Path
    server: str
    etcd_url: str
    ca_file: Path
    kubeconfigs: dict[str, Path]
    tokens: dict[str, str]
    pids: dict[str, int]
    logs: dict[str, Path]
    binaries: Binaries
    apiserver_args: list[str]
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
            raise ControlPlaneError(f"kubectl {shlex.join(args)} (as {identity}) failed: {detail}")
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
                raise ControlPlaneError(f"no RBAC manifests in {directory}")
            args = ["apply"]
            for manifest in manifests:
                args += ["-f", str(manifest)]
            self.kubectl(*args)

    # -- health ------------------------------------------------------------

    def ssl_context(self) -> ssl.SSLContext:
        """TLS context that verifies the apiserver against our CA (hostname
        127.0.0.1 is in the certificate's SANs)."""
        return ssl.create_default_context(cafile=str(self.ca_file))

    def is_ready(self) -> bool:
        """GET /readyz as admin, TLS verified."""
        try:
            status, _ = _http_get(
                f"{self.server}/readyz",
                token=self.tokens["admin"],
                context=self.ssl_context(),
            )
        except (OSError, ssl.SSLError):
            return False
        return status == HTTPStatus.OK

    def processes_alive(self) -> dict[str, bool]:
        return {name: _pid_is_ours(pid, str(self.state_dir)) for name, pid in self.pids.items()}

    # -- lifecycle ---------------------------------------------------------

    def stop(self) -> None:
        """Stop kube-apiserver then etcd (by recorded PID; SIGKILL after
        :data:`STOP_GRACE` seconds).  Idempotent."""
        errors: list[str] = []
        for name in ("kube-apiserver", "etcd"):
            pid = self.pids.get(name)
            if pid is None:
                continue
            try:
                _terminate(pid, str(self.state_dir), self._children.get(name))
            except ControlPlaneError as exc:
                errors.append(str(exc))
            self._children.pop(name, None)
        if errors:
            raise ControlPlaneError("; ".join(errors))

    def restart_apiserver(self, timeout: float = APISERVER_READY_TIMEOUT) -> None:
        """Stop and start kube-apiserver only (same port, certs, tokens, etcd)
        and wait until ready -- for "a watch survives an apiserver restart"."""
        pid = self.pids.get("kube-apiserver")
        if pid is not None:
            _terminate(pid, str(self.state_dir), self._children.pop("kube-apiserver", None))
        self._spawn("kube-apiserver", self.apiserver_args)
        self._save()
        self._wait_apiserver_ready(timeout)

    # -- internals ---------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> None:
        log_path = self.logs[name]
        with open(log_path, "ab") as log:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            log.write(f"\n==== {stamp} starting {name}\n".encode())
            log.flush()
            # Unless detached (the CLI's `up`, whose cluster must outlive it),
            # tie the child to this thread's life.  PDEATHSIG fires when the
            # *thread* that forked exits, so only the main thread qualifies: a
            # restart from a short-lived worker thread must not arm it.
            tie = not self.detached and threading.current_thread() is threading.main_thread()
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # Only a prctl() call runs between fork and exec: no locks, no
                # allocation, so the usual preexec_fn/threads hazard is absent.
                preexec_fn=_die_with_parent if tie else None,  # noqa: PLW1509
            )
        self._children[name] = child
        self.pids[name] = child.pid

    def _check_alive(self, name: str) -> None:
        child = self._children.get(name)
        if child is not None and child.poll() is not None:
            raise ControlPlaneError(
                f"{name} exited with status {child.returncode} during start-up; "
                f"log {self.logs[name]}:\n{_tail(self.logs[name])}"
            )

    def _wait_etcd_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            self._check_alive("etcd")
            try:
                status, body = _http_get(f"{self.etcd_url}/health")
                if status == HTTPStatus.OK and '"true"' in body:
                    return
                last = f"HTTP {status}: {body.strip()}"
            except OSError as exc:
                last = str(exc)
            if time.monotonic() >= deadline:
                raise ControlPlaneError(
                    f"etcd not healthy after {timeout:.0f}s ({last}); "
                    f"log {self.logs['etcd']}:\n"
                    f"{_tail(self.logs['etcd'])}"
                )
            time.sleep(0.2)

    def _wait_apiserver_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while True:
            self._check_alive("kube-apiserver")
            if self.ca_file.is_file():
                try:
                    status, body = _http_get(
                        f"{self.server}/readyz",
                        token=self.tokens["admin"],
                        context=self.ssl_context(),
                    )
                    if status == HTTPStatus.OK:
                        return
                    last = f"HTTP {status}: {' '.join(body.split())[-300:]}"
                except (OSError, ssl.SSLError) as exc:
                    last = str(exc)
            else:
                last = f"{self.ca_file} not written yet"
            if time.monotonic() >= deadline:
                raise ControlPlaneError(
                    f"kube-apiserver not ready after {timeout:.0f}s ({last}); "
                    f"log {self.logs['kube-apiserver']}:\n"
                    f"{_tail(self.logs['kube-apiserver'])}"
                )
            time.sleep(0.25)

    def _to_json(self) -> dict[str, Any]:
        return {
            "version": 1,
            "server": self.server,
            "etcd_url": self.etcd_url,
            "ca_file": str(self.ca_file),
            "kubeconfigs": {k: str(v) for k, v in self.kubeconfigs.items()},
            "tokens": self.tokens,
            "pids": self.pids,
            "logs": {k: str(v) for k, v in self.logs.items()},
            "binaries": {
                "etcd": str(self.binaries.etcd),
                "kube_apiserver": str(self.binaries.kube_apiserver),
                "kubectl": str(self.binaries.kubectl),
            },
            "apiserver_args": self.apiserver_args,
            "detached": self.detached,
        }

    def _save(self) -> None:
        _write_atomic(
            self.state_dir / STATE_FILE,
            json.dumps(self._to_json(), indent=2) + "\n",
            mode=0o600,
        )

    @classmethod
    def load(cls, state_dir: Path) -> ControlPlane:
        """Re-attach to a control plane started earlier (e.g. by ``up``) from
        its state record; processes are not checked."""
        state_dir = state_dir.resolve()
        try:
            raw = json.loads((state_dir / STATE_FILE).read_text())
        except FileNotFoundError:
            raise ControlPlaneError(f"no control plane state in {state_dir}") from None
        except json.JSONDecodeError as exc:
            raise ControlPlaneError(f"corrupt {state_dir / STATE_FILE}: {exc}") from None
        try:
            b = raw["binaries"]
            return cls(
                state_dir=state_dir,
                server=raw["server"],
                etcd_url=raw["etcd_url"],
                ca_file=Path(raw["ca_file"]),
                kubeconfigs={k: Path(v) for k, v in raw["kubeconfigs"].items()},
                tokens=dict(raw["tokens"]),
                pids={k: int(v) for k, v in raw["pids"].items()},
                logs={k: Path(v) for k, v in raw["logs"].items()},
                binaries=Binaries(Path(b["etcd"]), Path(b["kube_apiserver"]), Path(b["kubectl"])),
                apiserver_args=list(raw["apiserver_args"]),
                detached=bool(raw.get("detached", True)),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ControlPlaneError(f"unreadable {state_dir / STATE_FILE}: {exc!r}") from None


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


def _prepare_state_dir(state_dir: Path) -> None:
    """Create ``state_dir`` or clear a previous (stopped) run out of it.

    Only entries this module creates are removed, and only when our state
    record is present: pointing NODETASKD_CLUSTER_DIR at a populated
    directory by mistake must not delete anything."""
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    entries = {p.name for p in state_dir.iterdir()}
    if not entries:
        return
    if STATE_FILE not in entries:
        raise ControlPlaneError(f"refusing to use non-empty directory {state_dir} (no {STATE_FILE} in it)")
    previous = ControlPlane.load(state_dir)
    if any(previous.processes_alive().values()):
        raise ControlPlaneError(f"a control plane is still running from {state_dir}; stop it first")
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
    per start.  On any failure everything started so far is stopped again.
    With ``detach=False`` (tests) the kernel also terminates both processes if
    the calling process dies without running :meth:`ControlPlane.stop`;
    ``detach=True`` (the CLI's ``up``) lets them outlive the caller.
    """
    binaries = binaries or ensure_binaries()
    state_dir = state_dir.expanduser().resolve()
    _prepare_state_dir(state_dir)

    etcd_port, peer_port, api_port = ports.free_ports(3)
    pki = state_dir / "pki"
    pki.mkdir(mode=0o700)

    sa_key = state_dir / "sa.key"
    _run_quiet(["openssl", "genrsa", "-out", str(sa_key), "2048"], what="openssl genrsa")
    os.chmod(sa_key, 0o600)

    tokens = {name: secrets.token_urlsafe(32) for name in IDENTITIES}
    token_lines = [
        f'{tokens[name]},{ident.user},{ident.user},"{",".join(ident.groups)}"\n' for name, ident in IDENTITIES.items()
    ]
    token_file = state_dir / "tokens.csv"
    _write_atomic(token_file, "".join(token_lines), mode=0o600)

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
        f"--cert-dir={pki}",
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
        ca_file=pki / "apiserver.crt",
        kubeconfigs={name: state_dir / f"{name}.kubeconfig" for name in IDENTITIES},
        tokens=tokens,
        pids={},
        logs={
            "etcd": state_dir / "etcd.log",
            "kube-apiserver": state_dir / "kube-apiserver.log",
        },
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
            _write_atomic(
                cp.kubeconfigs[name],
                _kubeconfig(cp.server, ca_pem, ident.user, tokens[name]),
                mode=0o600,
            )
    except BaseException:
        with contextlib.suppress(ControlPlaneError):
            cp.stop()
        raise
    return cp


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _running(state_dir: Path) -> ControlPlane | None:
    """The control plane recorded in ``state_dir`` if all its processes are
    alive and the apiserver is ready, else ``None``."""
    try:
        cp = ControlPlane.load(state_dir)
    except ControlPlaneError:
        return None
    alive = cp.processes_alive()
    if set(alive) != {"etcd", "kube-apiserver"} or not all(alive.values()):
        return None
    return cp if cp.is_ready() else None


def _cmd_up(state_dir: Path, rbac_dir: Path) -> int:
    started = time.monotonic()
    cp = _running(state_dir)
    if cp is not None:
        _log(f"already running at {cp.server} (state {state_dir})")
    else:
        if (state_dir / STATE_FILE).exists():
            with contextlib.suppress(ControlPlaneError):
                ControlPlane.load(state_dir).stop()  # half-dead leftovers
        binaries = ensure_binaries()
        cp = start(state_dir, binaries, detach=True)
        _log(f"started {cp.server} in {time.monotonic() - started:.1f}s (logs in {state_dir})")
    cp.apply_rbac(rbac_dir)
    print(f"export KUBECONFIG={shlex.quote(str(cp.admin_kubeconfig))}")
    return 0


def _cmd_down(state_dir: Path) -> int:
    try:
        cp = ControlPlane.load(state_dir)
    except ControlPlaneError:
        _log(f"nothing to stop (no state in {state_dir})")
        return 0
    cp.stop()
    _log("stopped")
    return 0


def _cmd_status(state_dir: Path) -> int:
    try:
        cp = ControlPlane.load(state_dir)
    except ControlPlaneError:
        print(f"not running (no state in {state_dir})")
        return 1
    alive = cp.processes_alive()
    ready = all(alive.values()) and cp.is_ready()
    print(f"{'running' if ready else 'NOT ready'}: {cp.server}")
    for name, pid in cp.pids.items():
        state = "alive" if alive.get(name) else "dead"
        print(f"  {name}: pid {pid} {state}, log {cp.logs[name]}")
    for name, path in cp.kubeconfigs.items():
        if path.exists():
            print(f"  {name}.kubeconfig: {path}")
    return 0 if ready else 1


def _cmd_env(state_dir: Path) -> int:
    cp = _running(state_dir)
    if cp is None:
        _log(f"not running (state {state_dir}); run `python3 tools/provision/controlplane.py up`")
        return 1
    print(f"export KUBECONFIG={shlex.quote(str(cp.admin_kubeconfig))}")
    for name, path in cp.kubeconfigs.items():
        print(f"export NODETASKD_{name.upper()}_KUBECONFIG={shlex.quote(str(path))}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="controlplane.py",
        description="Real kube-apiserver + etcd on 127.0.0.1 for tests and demos.",
    )
    parser.add_argument("command", choices=("up", "down", "status", "env"))
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="cluster state directory (default: $NODETASKD_CLUSTER_DIR or ~/.cache/nodetaskd/cluster)",
    )
    parser.add_argument(
        "--rbac-dir",
        type=Path,
        default=DEFAULT_RBAC_DIR,
        help="manifests applied by `up`",
    )
    args = parser.parse_args(argv)
    state_dir: Path = (args.state_dir or default_cluster_dir()).expanduser().resolve()
    try:
        if args.command == "up":
            return _cmd_up(state_dir, args.rbac_dir)
        if args.command == "down":
            return _cmd_down(state_dir)
        if args.command == "status":
            return _cmd_status(state_dir)
        return _cmd_env(state_dir)
    except ControlPlaneError as exc:
        print(f"controlplane: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "APISERVER_READY_TIMEOUT",
    "DEFAULT_RBAC_DIR",
    "IDENTITIES",
    "KUBERNETES_VERSION",
    "Binaries",
    "ControlPlane",
    "ControlPlaneError",
    "Identity",
    "apiserver_binary_path",
    "cache_dir",
    "default_cluster_dir",
    "ensure_binaries",
    "main",
    "start",
]
