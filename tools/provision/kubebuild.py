"""Kubernetes binaries built from Debian bookworm's ``kubernetes`` source package, cached per machine.

Debian bookworm ships no kube-apiserver, kubelet or kube-controller-manager package, only the
``kubernetes`` *source* package (1.20.2). :func:`ensure_built` fetches that source with a private apt
configuration (the system's sources are never edited), swaps in a vendored ``reflect2`` that works under
Go >= 1.18, patches kube-openapi's type validator so that it accepts empty strings under Go >= 1.16,
builds the commands with Debian's Go (``CGO_ENABLED=0``) and the pause program of the pod sandbox
(``build/pause/linux/pause.c``, ``gcc -static``), and caches each product outside the repository
under its own name and build revision. Everything comes from the Debian archive, so it works on
machines that can only reach Debian and PyPI.

The tree is unpacked once for every product missing at that moment (one ``make WHAT="cmd/a cmd/b"``):
a machine that runs the control plane also runs real nodes, and unpacking and compiling the shared
packages is half of each build.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

from tools.provision import host

KUBERNETES_VERSION: Final = "1.20.2"
"""Upstream version inside Debian bookworm's ``kubernetes`` source package."""

BUILD_REVISIONS: Final[Mapping[str, int]] = {
    "kube-apiserver": 2,
    "kube-controller-manager": 1,
    "kubelet": 1,
    "kubelet-next": 1,
    "pause": 1,
}
"""Each product's build revision, in its cached name: bumped whenever what is built for it changes, so that
a binary cached by an older (broken) revision is never picked up again. kube-apiserver 1: reflect2 swap
only (empty strings in custom resources were rejected as null); 2: plus the kube-openapi zero-value fix.
The others started with both."""

APISERVER_BUILD_REVISION: Final = BUILD_REVISIONS["kube-apiserver"]

NEXT_KUBELET_VERSION: Final = "1.20.3-nodetaskd.1"
"""The version string of ``kubelet-next``: the same source as ``kubelet``, built a second time with this
version, so that a NodeUpgradeJob has a newer kubelet to install (semantically newer than
:data:`KUBERNETES_VERSION`; the ``nodetaskd`` pre-release says it is no upstream release)."""

_COMMANDS: Final = ("kube-apiserver", "kube-controller-manager", "kubelet")
"""Products that are ``cmd/<name>`` of the tree; the rest are compiled by :func:`_build_pause`."""

DEBIAN_SUITE: Final = "bookworm"
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"
HEARTBEAT_SECONDS: Final = 15.0

BUILD_PACKAGES: Final = (
    "golang-go",
    "make",
    "rsync",
    "dpkg-dev",
    "golang-github-modern-go-reflect2-dev",
    "gcc",
    "libc6-dev",
)
_REFLECT2_SRC: Final = Path("/usr/share/gocode/src/github.com/modern-go/reflect2")

_OPENAPI_TYPE_VALIDATOR: Final = Path("vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go")
_OPENAPI_ZERO_CHECK: Final = (
    "if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {"
)
_OPENAPI_NIL_CHECK: Final = "if data == nil {"


def _log(message: str) -> None:
    host.log(message, prefix="kubebuild")


def binary_path(product: str) -> Path:
    """The cached binary of ``product`` (a key of :data:`BUILD_REVISIONS`), its name carrying its revision."""
    try:
        revision = BUILD_REVISIONS[product]
    except KeyError:
        known = ", ".join(BUILD_REVISIONS)
        raise host.ControlPlaneError(f"unknown Kubernetes product {product!r} (known: {known})") from None
    return host.cache_dir() / f"{product}-{KUBERNETES_VERSION}-{revision}"


def _usable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def ensure_built(products: Iterable[str]) -> dict[str, Path]:
    """The cached binaries of ``products``, building them (and every other missing product) first if needed.

    The fast path (all present) takes milliseconds and no lock. Otherwise a lock file in the cache
    directory serialises builders (parallel test sessions, ``up`` racing a test run), and whoever waited
    checks again before doing anything, so each build happens once per machine.
    """
    wanted = {product: binary_path(product) for product in products}
    if all(_usable(path) for path in wanted.values()):
        return wanted
    cache = host.cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    # The lock's name predates the other products: checkouts that only know kube-apiserver take the same
    # lock, and every builder uses the same work directory.
    with host.file_lock(cache / f"kube-apiserver-{KUBERNETES_VERSION}.lock"):
        missing = [product for product in BUILD_REVISIONS if not _usable(binary_path(product))]
        if any(product in missing for product in wanted):
            host.apt_install([pkg for pkg in BUILD_PACKAGES if not host.dpkg_installed(pkg)])
            _build(missing)
    return wanted


def _system_mirror() -> tuple[str, str | None]:
    """(URI, signed-by keyring) of the system's Debian ``bookworm`` main source.

    Reusing the system's mirror matters on machines that may only reach a
    specific (e.g. internal or snapshot) mirror."""
    apt = Path("/etc/apt")
    for path in sorted((apt / "sources.list.d").glob("*.sources")):
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


def _fetch_source(work: Path) -> Path:
    """Download and unpack Debian's kubernetes source under ``work``; the tree's path."""
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
    host.run_quiet(["apt-get", *apt_opts, "update", "-qq"], what="apt-get update (deb-src)")
    src_dl = work / "download"
    src_dl.mkdir()
    host.run_quiet(
        ["apt-get", *apt_opts, "source", "--download-only", "kubernetes"],
        cwd=src_dl,
        what="apt-get source kubernetes",
    )
    dscs = sorted(src_dl.glob("kubernetes_*.dsc"))
    if len(dscs) != 1:
        raise host.ControlPlaneError(f"expected one kubernetes_*.dsc in {src_dl}, found {len(dscs)}")
    if f"really{KUBERNETES_VERSION}" not in dscs[0].name and KUBERNETES_VERSION not in dscs[0].name:
        raise host.ControlPlaneError(f"Debian source {dscs[0].name} is not Kubernetes {KUBERNETES_VERSION}")
    tree = work / "kubernetes"
    _log(f"unpacking {dscs[0].name}")
    host.run_quiet(["dpkg-source", "-x", str(dscs[0]), str(tree)], what="dpkg-source -x")
    for dsc_file in src_dl.iterdir():  # tarballs are no longer needed; save ~35 MB
        dsc_file.unlink()
    return tree


def _build(products: Sequence[str]) -> None:
    """Fetch Debian's kubernetes source, patch it for Go 1.19, build ``products``, install each atomically.

    The work tree lives in the cache directory (``build/``); it is wiped before
    a build and removed after a successful one. On failure it is kept and the
    error names the full log."""
    work = host.cache_dir() / "build"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log_path = work / "build.log"
    started = time.monotonic()
    tree = _fetch_source(work)

    # reflect2 v1.0.1 reads Go map internals that changed in Go 1.18; the
    # apiserver then dies with "fatal error: fault" the first time it encodes a
    # custom resource. 1.0.2 (API-compatible) fixes that.
    vendored = tree / "vendor" / "github.com" / "modern-go" / "reflect2"
    if not _REFLECT2_SRC.is_dir():
        raise host.ControlPlaneError(f"{_REFLECT2_SRC} missing; install golang-github-modern-go-reflect2-dev")
    shutil.rmtree(vendored)
    shutil.copytree(_REFLECT2_SRC, vendored, symlinks=False)
    # A go.mod inside vendor/ would split the directory off as its own module.
    (vendored / "go.mod").unlink(missing_ok=True)
    _patch_openapi_zero_check(tree)

    built: dict[str, Path] = {}
    if "pause" in products:
        built["pause"] = _build_pause(tree)
    commands = [p for p in products if p in _COMMANDS]
    if commands:
        built.update(_make(tree, commands, log_path=log_path, started=started))
    for product, path in built.items():
        host.install_atomic(path, binary_path(product))
    if "kubelet-next" in products:
        # After the first build is installed: the second one writes the same _output/bin/kubelet, and
        # Go's build cache makes it little more than a link.
        next_kubelet = _make(
            tree, ["kubelet"], log_path=work / "build-next.log", started=started, version=NEXT_KUBELET_VERSION
        )
        host.install_atomic(next_kubelet["kubelet"], binary_path("kubelet-next"))
    shutil.rmtree(work, ignore_errors=True)
    _log(f"built {', '.join(products)} in {_fmt_elapsed(time.monotonic() - started)}, cached in {host.cache_dir()}")


def _make(
    tree: Path, commands: Sequence[str], *, log_path: Path, started: float, version: str = KUBERNETES_VERSION
) -> dict[str, Path]:
    # The kubernetes 1.20 build scripts expect a GOPATH with the tree at
    # k8s.io/kubernetes (what debian/rules sets up).
    gopath = tree / ".go"
    link = gopath / "src" / "k8s.io" / "kubernetes"
    if not link.is_symlink():
        link.parent.mkdir(parents=True)
        link.symlink_to(Path("../../.."))
    env = {
        **os.environ,
        "GOPATH": str(gopath),
        "CGO_ENABLED": "0",
        "PATH": f"/usr/lib/go/bin:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GOFLAGS": "",
    }
    if version != KUBERNETES_VERSION:
        # hack/lib/version.sh stamps these into k8s.io/component-base/version (what `--version` and the
        # Node's kubeletVersion report). From a file: the environment's KUBE_GIT_VERSION loses to the tag
        # written into the script when the source was archived.
        major, minor = version.split(".")[:2]
        stamp = tree / ".nodetaskd-version"
        stamp.write_text(
            f"KUBE_GIT_COMMIT=''\nKUBE_GIT_TREE_STATE='archive'\nKUBE_GIT_VERSION='v{version}'\n"
            f"KUBE_GIT_MAJOR='{major}'\nKUBE_GIT_MINOR='{minor}'\n"
        )
        env["KUBE_GIT_VERSION_FILE"] = str(stamp)
    what = " ".join(f"cmd/{c}" for c in commands)
    _log(f"building {what} {version} (about 5 minutes each on 2 cores; full log: {log_path})")
    _stream_build(
        ["make", f"WHAT={what}"],
        cwd=gopath / "src" / "k8s.io" / "kubernetes",
        env=env,
        log_path=log_path,
        started=started,
    )
    built: dict[str, Path] = {}
    for command in commands:
        path = (tree / "_output" / "bin" / command).resolve()
        if not path.is_file():
            raise host.ControlPlaneError(f"build finished but {path} does not exist; see {log_path}")
        reported = host.run_quiet([str(path), "--version"], what=f"{command} --version").strip()
        if reported != f"Kubernetes v{version}":
            raise host.ControlPlaneError(f"built {command} reports {reported!r}, expected 'Kubernetes v{version}'")
        built[command] = path
    return built


def _build_pause(tree: Path) -> Path:
    """The pod sandbox's process, as the tree's ``build/pause/Makefile`` compiles it (static, so that the
    image needs nothing else)."""
    source = tree / "build" / "pause" / "linux" / "pause.c"
    makefile = tree / "build" / "pause" / "Makefile"
    if not source.is_file():
        raise host.ControlPlaneError(f"{source} missing from the Debian source tree")
    tag = re.search(r"^TAG\s*[?:]?=\s*(\S+)", makefile.read_text(), re.MULTILINE) if makefile.is_file() else None
    version = f"v{tag[1] if tag else KUBERNETES_VERSION}-nodetaskd"
    output = tree / "_output" / "pause"
    output.parent.mkdir(parents=True, exist_ok=True)
    _log(f"compiling pause {version} (gcc -static)")
    host.run_quiet(
        ["gcc", "-Os", "-Wall", "-Werror", "-static", f"-DVERSION={version}", "-o", str(output), str(source)],
        what="gcc -static pause.c",
    )
    return output


def _patch_openapi_zero_check(tree: Path) -> None:
    """Make kube-openapi's type validator treat only ``nil`` as null.

    Its check ``reflect.DeepEqual(reflect.Zero(T), reflect.ValueOf(data))``
    compares two ``reflect.Value`` headers, which never matched before Go 1.16.
    Since Go 1.16 ``reflect.Zero`` and the runtime's conversion of ``""`` to
    ``interface{}`` both point at the same shared zero buffer, so every empty
    string in a custom resource fails schema validation with
    ``Invalid value: "null": ... must be of type string``. This is
    kubernetes/kubernetes#99804, fixed in Kubernetes 1.21 by
    kubernetes/kube-openapi#230 (the same one-line change as here). The
    ``go-openapi/validate`` copy in vendor/ has the same line but is not
    linked into kube-apiserver."""
    path = tree / _OPENAPI_TYPE_VALIDATOR
    try:
        source = path.read_text()
    except FileNotFoundError:
        raise host.ControlPlaneError(f"{path} missing; cannot apply the kube-openapi zero-value fix") from None
    if source.count(_OPENAPI_ZERO_CHECK) != 1:
        raise host.ControlPlaneError(f"{path}: expected exactly one {_OPENAPI_ZERO_CHECK!r}; source changed?")
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
    one line each with the elapsed time. Compiling a command itself is
    a single silent step of several minutes, so a heartbeat thread prints the
    elapsed time whenever nothing was printed for 15 s, so nobody mistakes the
    build for a hang. On failure the last lines are echoed too."""
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
        raise host.ControlPlaneError(f"Kubernetes build failed (exit {rc}): {last.strip()} -- full log: {log_path}")


__all__ = [
    "APISERVER_BUILD_REVISION",
    "BUILD_PACKAGES",
    "BUILD_REVISIONS",
    "KUBERNETES_VERSION",
    "NEXT_KUBELET_VERSION",
    "binary_path",
    "ensure_built",
]
