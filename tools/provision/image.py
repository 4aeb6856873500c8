#!/usr/bin/env python3
"""Build the controller's and hubs' image without a container engine, into an OCI layout, and push it.

What ``containers/Containerfile`` builds with a daemon, assembled here from parts this machine can
reach (Debian's archive and PyPI; no registry holds a base image for us):

1. **base** - Debian bookworm's ``python3.11`` and the libraries it and the wheels link against,
   extracted by ``mmdebstrap --variant=extract`` (with bookworm's security updates), without
   documentation, plus a ``nodetaskd`` user (65532) and its writable home ``/var/lib/nodetaskd``;
2. **deps** - the wheels of the ``cloud`` extra's closure, chosen by pip for CPython 3.11 on
   manylinux x86_64 whatever Python runs this script, installed into
   ``/usr/local/lib/python3.11/dist-packages`` (on Debian's ``sys.path``);
3. **app** - this working tree's ``nodetaskd`` wheel and the ``/usr/local/bin/nodetaskd`` entry point.

Every layer is an uncompressed tar with sorted entries, zero times and numeric owners, its Python
compiled to unchecked-hash bytecode by the image's own interpreter (so that nothing is compiled at
run time, on a read-only root); ``umoci`` puts the layers and the config (user 65532, entry point,
environment, ports) into the layout and ``skopeo`` copies it to a registry. The base and deps
layers are cached in ``~/.cache/nodetaskd/image`` (keyed by what went into them), so a rebuild after
a code change costs the app layer only. Usage::

    python3 tools/provision/image.py                                    # build into the cache's layout
    python3 tools/provision/image.py --push 127.0.0.1:5000/nodetaskd:0.1.0
    python3 tools/provision/image.py --layout /tmp/oci --tag 0.1.0 --push registry.example.com/nodetaskd:0.1.0

The last line printed is the pushed reference with its digest (``host/repo@sha256:...``), or the
layout and tag when nothing is pushed. Plain HTTP (no TLS verification) is used for loopback
registries only. Missing Debian tools (mmdebstrap, umoci, skopeo) are installed with apt-get (root).
Stdlib only, like the other provisioning scripts.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

try:
    from tools.provision import containerd as _ctd
    from tools.provision import controlplane as _cp
except ModuleNotFoundError:  # run as a script: the repository root is not on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tools.provision import containerd as _ctd
    from tools.provision import controlplane as _cp

ROOT: Final = _cp.REPO_ROOT
SUITE: Final = "bookworm"
PYTHON: Final = "python3.11"
BASE_PACKAGES: Final = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "base-files")
"""Python with its standard library (ssl, sqlite3, ctypes...), the C++ runtime grpcio's wheel links
against, and /etc/os-release (what image scanners read). No shell, no package manager."""
BASE_REVISION: Final = 1
"""Bumped when what :func:`base_layer` makes of the packages changes, so that no stale cache is used."""
SITE: Final = f"usr/local/lib/{PYTHON}/dist-packages"
SOURCES: Final = ("pyproject.toml", "README.md", "nodetask", "roles", "flows", "schemas")
"""What the wheel is built from: the files the Containerfile copies."""
USER: Final = 65532
HOME: Final = "var/lib/nodetaskd"
PORTS: Final = ("9443/tcp", "9090/tcp", "10004/tcp", "10002/tcp")
ENV: Final = (
    "PATH=/usr/local/bin:/usr/bin:/bin",
    "PYTHONUNBUFFERED=1",
    "PYTHONDONTWRITEBYTECODE=1",
    "LANG=C.UTF-8",
)
CREATED: Final = "1970-01-01T00:00:00Z"
"""Every time stamp in the image (``SOURCE_DATE_EPOCH`` overrides it): the same tree gives the same layers."""
DROPPED: Final = (
    "usr/share/doc/",
    "usr/share/man/",
    "usr/share/info/",
    "usr/share/locale/",
    "usr/share/lintian/",
    "usr/share/bug/",
    "usr/share/gdb/",
    "usr/share/polkit-1/",
    "usr/lib/x86_64-linux-gnu/gconv/",
    "var/cache/",
    "var/lib/apt/",
    "var/log/",
    "etc/apt/",
)
"""Base paths left out (documentation and package-manager state); licences stay (below)."""
ENTRY_POINT: Final = f"""#!/usr/bin/{PYTHON}
import sys

from roles.cli.main import main

sys.exit(main())
"""
_MANYLINUX: Final = [f"manylinux_2_{minor}_x86_64" for minor in range(5, 37)] + [
    "manylinux1_x86_64",
    "manylinux2010_x86_64",
    "manylinux2014_x86_64",
]
"""Wheel platforms bookworm's glibc 2.36 runs, whatever the machine running pip is."""


class ImageError(RuntimeError):
    """A step of the build or the push failed; the message names it."""


def _log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    return _cp.cache_dir() / "image"


@dataclass(frozen=True)
class Tools:
    mmdebstrap: Path
    umoci: Path
    skopeo: Path


def ensure_tools() -> Tools:
    """mmdebstrap, umoci and skopeo, installed from Debian when missing (under the shared apt lock)."""
    runtime = _ctd.ensure_tools()
    if _cp._which("mmdebstrap") is None:
        cache = _cp.cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        with _cp._file_lock(cache / "apt.lock"):
            if _cp._which("mmdebstrap") is None:
                _cp._apt_install(["mmdebstrap"])
    found = _cp._which("mmdebstrap")
    if found is None:
        raise ImageError("mmdebstrap is still not on PATH after installing it")
    return Tools(mmdebstrap=found, umoci=runtime.umoci, skopeo=runtime.skopeo)


def _run(argv: Sequence[str | Path], *, what: str, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    result = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, check=False, timeout=timeout, env=env
    )
    if result.returncode != 0:
        lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise ImageError(f"{what} failed (exit {result.returncode}): {' | '.join(lines[-5:]) or '(no output)'}")
    return result.stdout


def _key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _epoch() -> int:
    return int(os.environ.get("SOURCE_DATE_EPOCH", "0"))


# -------------------------------------------------------------------------------------------- layers


def write_layer(tree: Path, tar_path: Path) -> None:
    """``tree`` as a reproducible, uncompressed layer tar: sorted, one mtime, numeric owners, no PAX times."""
    mtime = _epoch()

    def entries() -> Iterator[Path]:
        for dirpath, dirnames, filenames in os.walk(tree):
            dirnames.sort()
            here = Path(dirpath)
            if here != tree:
                yield here
            for name in sorted(filenames):
                yield here / name
            # Symlinks to directories are listed in dirnames but not walked: yield them as links.
            for name in dirnames:
                if (here / name).is_symlink():
                    yield here / name
            dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]

    partial = tar_path.with_suffix(".partial")
    with tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        for path in entries():
            info = tar.gettarinfo(str(path), arcname=path.relative_to(tree).as_posix())
            info.mtime = mtime
            info.uname = info.gname = ""
            # Owned by root, whoever builds, except what belongs to the image's own user.
            info.uid = info.uid if info.uid == USER else 0
            info.gid = info.gid if info.gid == USER else 0
            if info.isfile():
                with path.open("rb") as data:
                    tar.addfile(info, data)
            else:
                tar.addfile(info)
    partial.replace(tar_path)


def _compile(python: Path, stage: Path, directory: str) -> None:
    """Byte-compile ``stage/directory`` with the image's interpreter, as the paths it will have in the image."""
    _run(
        [
            python,
            "-m",
            "compileall",
            "-q",
            "-j0",
            "--invalidation-mode",
            "unchecked-hash",
            "-s",
            str(stage),
            "-p",
            "/",
            str(stage / directory),
        ],
        what=f"compiling {directory}",
    )


def base_layer(tools: Tools, *, refresh: bool = False) -> tuple[Path, Path]:
    """The base layer's tar and the unpacked base (whose python compiles the other layers), cached."""
    key = _key(SUITE, BASE_PACKAGES, BASE_REVISION, DROPPED, USER, _epoch())
    home = cache_dir() / f"base-{key}"
    layer, rootfs = home / "layer.tar", home / "rootfs"
    if layer.exists() and not refresh:
        return layer, rootfs
    _log(f"extracting Debian {SUITE}'s {PYTHON} with mmdebstrap (cached in {home})")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    packages = home / "packages.tar"
    _run(
        [tools.mmdebstrap, "--quiet", "--variant=extract", f"--include={','.join(BASE_PACKAGES)}", SUITE, packages],
        what="mmdebstrap",
    )
    rootfs.mkdir()
    with tarfile.open(packages) as tar:
        kept = [m for m in tar.getmembers() if _kept(m.name)]
        # Debian's own archive, as dpkg would unpack it (absolute symlinks such as /lib64's included).
        tar.extractall(rootfs, members=kept, filter="fully_trusted")
    packages.unlink()
    _add_system_files(rootfs)
    _compile(rootfs / "usr" / "bin" / PYTHON, rootfs, f"usr/lib/{PYTHON}")
    write_layer(rootfs, layer)
    return layer, rootfs


def _kept(name: str) -> bool:
    path = name.removeprefix("./")
    if path.startswith("usr/share/doc/") and path.endswith("/copyright"):
        return True  # the licences of what the image ships
    return not any(path.startswith(prefix) or f"{path}/" == prefix for prefix in DROPPED)


def _add_system_files(rootfs: Path) -> None:
    etc = rootfs / "etc"
    (etc / "passwd").write_text(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"nodetaskd:x:{USER}:{USER}:nodetaskd:/{HOME}:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    (etc / "group").write_text(f"root:x:0:\nnodetaskd:x:{USER}:\nnogroup:x:65534:\n")
    tmp = rootfs / "tmp"
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    home = rootfs / HOME
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, USER, USER)
    home.chmod(0o700)
    python3 = rootfs / "usr" / "bin" / "python3"
    if not python3.exists():
        python3.symlink_to(PYTHON)


def wheel(work: Path, *, root: Path = ROOT) -> Path:
    """This tree's ``nodetaskd`` wheel, built from a copy of exactly what the Containerfile copies."""
    source = work / "source"
    for name in SOURCES:
        if (root / name).is_dir():
            shutil.copytree(root / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            source.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / name, source / name)
    wheels = work / "wheels"
    # The wheel's hash ends up in the image (direct_url.json): its zip entries get one fixed time (zip
    # starts in 1980) instead of the build's.
    fixed_time = {**os.environ, "SOURCE_DATE_EPOCH": str(max(_epoch(), 315532800))}
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels, f"{source}{os.sep}"],
        what="pip wheel (nodetaskd)",
        env=fixed_time,
    )
    (built,) = wheels.glob("nodetaskd-*.whl")
    return built


def python_layers(work: Path, base_rootfs: Path, *, root: Path = ROOT, refresh: bool = False) -> tuple[Path, Path]:
    """The deps and app layers as tars, each cached by what goes into it.

    The deps layer is keyed by the pins of the base install and the cloud extra in ``pyproject.toml``
    (their own dependencies, unpinned there, are resolved again with ``refresh``), the app layer by
    the content of the tree's sources: a rebuild of an unchanged tree runs no pip at all.
    """
    deps_layer = cache_dir() / f"deps-{_key(_pins(root), _MANYLINUX, _epoch())}.tar"
    app_layer = cache_dir() / f"app-{_key(_tree_digest(root), _epoch())}.tar"
    if deps_layer.exists() and app_layer.exists() and not refresh:
        return deps_layer, app_layer
    built = wheel(work, root=root)
    target = work / "target"
    platforms = [arg for platform in _MANYLINUX for arg in ("--platform", platform)]
    _log("installing the cloud extra's wheels for CPython 3.11 / manylinux x86_64 with pip")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--no-warn-script-location",
            "--target",
            target,
            "--only-binary=:all:",
            *platforms,
            "--python-version",
            "3.11",
            "--implementation",
            "cp",
            "--abi",
            "cp311",
            f"nodetaskd[cloud] @ {built.as_uri()}",
        ],
        what="pip install --target (the cloud extra)",
    )
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts carry this machine's interpreter
    (app_info,) = target.glob("nodetaskd-*.dist-info")
    app_files = {line.split(",", 1)[0] for line in (app_info / "RECORD").read_text().splitlines() if line}
    app_tops = {Path(f).parts[0] for f in app_files if not f.startswith("..")}
    python = base_rootfs / "usr" / "bin" / PYTHON

    if refresh or not deps_layer.exists():
        _log(f"compiling the dependencies (cached in {deps_layer})")
        stage = work / "deps"
        site = stage / SITE
        site.mkdir(parents=True)
        for entry in sorted(target.iterdir()):
            if entry.name not in app_tops:
                entry.rename(site / entry.name)
        _compile(python, stage, SITE)
        write_layer(stage, deps_layer)
        for stale in cache_dir().glob("deps-*.tar"):
            if stale != deps_layer:
                stale.unlink()

    if refresh or not app_layer.exists():
        stage = work / "app"
        site = stage / SITE
        site.mkdir(parents=True)
        for top in sorted(app_tops):
            (target / top).rename(site / top)
        script = stage / "usr" / "local" / "bin" / "nodetaskd"
        script.parent.mkdir(parents=True)
        script.write_text(ENTRY_POINT)
        script.chmod(0o755)
        _compile(python, stage, SITE)
        write_layer(stage, app_layer)
        for stale in cache_dir().glob("app-*.tar"):
            if stale != app_layer:
                stale.unlink()  # one app layer per tree: keep the cache from growing with every change
    return deps_layer, app_layer


def _pins(root: Path) -> list[str]:
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    return sorted([*project["dependencies"], *project["optional-dependencies"]["cloud"]])


def _tree_digest(root: Path) -> str:
    """A digest of every source file the wheel is built from (names and contents)."""
    digest = hashlib.sha256()
    for name in SOURCES:
        paths = [root / name] if (root / name).is_file() else sorted((root / name).rglob("*"))
        for path in paths:
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(path.relative_to(root).as_posix().encode() + b"\0")
                digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


# -------------------------------------------------------------------------------------------- image


def build(layout: Path, tag: str, *, tools: Tools, root: Path = ROOT, refresh: bool = False) -> str:
    """Build the image into the OCI ``layout`` (created if absent) as ``tag``; returns its manifest digest.

    Builds on one machine take turns (a lock in the cache): they share the cached layers.
    """
    cache_dir().mkdir(parents=True, exist_ok=True)
    with _cp._file_lock(cache_dir() / "build.lock"):
        return _build(layout, tag, tools=tools, root=root, refresh=refresh)


def _build(layout: Path, tag: str, *, tools: Tools, root: Path, refresh: bool) -> str:
    base, base_rootfs = base_layer(tools, refresh=refresh)
    created = _timestamp()
    # A fixed work directory: pip records the wheel's path in the image (direct_url.json), and the
    # same tree must give the same layers.
    work = cache_dir() / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        deps, app = python_layers(work, base_rootfs, root=root, refresh=refresh)
        if not (layout / "index.json").exists():
            layout.parent.mkdir(parents=True, exist_ok=True)
            _run([tools.umoci, "init", "--layout", layout], what="umoci init")
        image = f"{layout}:{tag}"
        with contextlib.suppress(ImageError):
            _run([tools.umoci, "rm", "--image", image], what="umoci rm")  # a rebuild replaces the tag
        _run([tools.umoci, "new", "--image", image], what="umoci new")
        for what, layer in (
            (f"Debian {SUITE} {PYTHON} (mmdebstrap: {' '.join(BASE_PACKAGES)})", base),
            ("pip install nodetaskd[cloud] dependencies", deps),
            ("pip install nodetaskd", app),
        ):
            _run(
                [
                    tools.umoci,
                    "raw",
                    "add-layer",
                    "--image",
                    image,
                    "--history.created",
                    created,
                    "--history.created_by",
                    what,
                    layer,
                ],
                what=f"umoci raw add-layer ({layer.name})",
            )
        config = [
            "--config.user",
            f"{USER}:{USER}",
            "--config.entrypoint",
            "/usr/local/bin/nodetaskd",
            "--config.workingdir",
            f"/{HOME}",
            "--config.label",
            "org.opencontainers.image.title=nodetaskd",
            "--config.label",
            f"org.opencontainers.image.version={tag}",
            "--config.label",
            "org.opencontainers.image.description=nodetaskd controller and cloud hub (the cloud extra)",
            "--architecture",
            "amd64",
            "--os",
            "linux",
            "--created",
            created,
            "--history.created",
            created,
            "--history.created_by",
            "image configuration",
        ]
        for env in ENV:
            config += ["--config.env", env]
        for port in PORTS:
            config += ["--config.exposedports", port]
        _run([tools.umoci, "config", "--image", image, *config], what="umoci config")
        _run([tools.umoci, "gc", "--layout", layout], what="umoci gc")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return manifest_digest(layout, tag)


def _timestamp() -> str:
    epoch = _epoch()
    if not epoch:
        return CREATED
    return datetime.datetime.fromtimestamp(epoch, tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def manifest_digest(layout: Path, tag: str) -> str:
    """The digest of the manifest ``tag`` names in the OCI ``layout``."""
    index = json.loads((layout / "index.json").read_text())
    for manifest in index.get("manifests", []):
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return str(manifest["digest"])
    raise ImageError(f"no image tagged {tag!r} in {layout}")


def push(layout: Path, tag: str, reference: str, *, tools: Tools) -> str:
    """Copy ``layout:tag`` to ``reference`` (``host[:port]/repository[:tag]``); returns the pushed digest."""
    host = reference.split("/", 1)[0]
    loopback = host.split(":", 1)[0] in ("127.0.0.1", "localhost", "[::1]")
    with tempfile.TemporaryDirectory(prefix="nodetaskd-push-") as tmp:
        policy, digest_file = Path(tmp) / "policy.json", Path(tmp) / "digest"
        # skopeo insists on a signature policy; this one accepts anything, so /etc is never read.
        policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        argv: list[str | Path] = [tools.skopeo, "--policy", policy, "copy", "--quiet", "--digestfile", digest_file]
        if loopback:
            argv.append("--dest-tls-verify=false")
        _run([*argv, f"oci:{layout}:{tag}", f"docker://{reference}"], what=f"skopeo copy to {reference}")
        return digest_file.read_text().strip()


def build_and_push(reference: str, *, layout: Path | None = None, tag: str = "", refresh: bool = False) -> str:
    """Build the image and push it to ``reference``; returns ``host/repository@digest``."""
    repository, _, ref_tag = reference.rpartition(":")
    if "/" in ref_tag or not repository:
        repository, ref_tag = reference, ""
    tag = tag or ref_tag or project_version()
    tools = ensure_tools()
    layout = layout or cache_dir() / "oci"
    build(layout, tag, tools=tools, refresh=refresh)
    target = reference if ref_tag else f"{repository}:{tag}"
    return f"{repository}@{push(layout, tag, target, tools=tools)}"


def project_version(root: Path = ROOT) -> str:
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="image.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--layout", type=Path, help="OCI layout directory (default: ~/.cache/nodetaskd/image/oci)")
    parser.add_argument("--tag", default="", help="tag in the layout (default: the push tag, else the version)")
    parser.add_argument("--push", metavar="HOST/REPOSITORY[:TAG]", help="push the image there and print its digest")
    parser.add_argument(
        "--refresh",
        action="store_true",
        help="extract Debian's packages (security updates) and resolve the wheels again",
    )
    args = parser.parse_args(argv)
    try:
        if args.push:
            print(build_and_push(args.push, layout=args.layout, tag=args.tag, refresh=args.refresh))
            return 0
        tools = ensure_tools()
        layout = args.layout or cache_dir() / "oci"
        tag = args.tag or project_version()
        digest = build(layout, tag, tools=tools, refresh=args.refresh)
        print(f"oci:{layout}:{tag} {digest}")
    except (ImageError, _ctd.RuntimeServicesError, _cp.ControlPlaneError) as exc:
        print(f"image: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "ImageError",
    "Tools",
    "base_layer",
    "build",
    "build_and_push",
    "ensure_tools",
    "manifest_digest",
    "project_version",
    "push",
    "write_layer",
]
