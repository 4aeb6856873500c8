"""The image's three layers (:mod:`tools.provision.image`), each a reproducible tar cached by what goes into it:
Debian's Python as the base, the cloud extra's wheels, and this tree's ``nodetaskd``. Stdlib only."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from tools.provision.image_tools import ROOT, Tools, cache_dir, cache_key, log, run, source_epoch

SUITE: Final = "bookworm"
PYTHON: Final = "python3.11"
BASE_PACKAGES: Final = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "base-files")
"""Python with its standard library (ssl, sqlite3, ctypes...), the C++ runtime grpcio's wheel links
against, and /etc/os-release (what image scanners read). No shell, no package manager."""
BASE_REVISION: Final = 1
"""Bumped when what :func:`base_layer` makes of the packages changes, so that no stale cache is used."""
SITE: Final = f"usr/local/lib/{PYTHON}/dist-packages"
SOURCES: Final = ("pyproject.toml", "README.md", "LICENSE", "nodetask", "roles", "flows", "schemas")
"""What the wheel is built from: the files the Containerfile copies."""
CONSTRAINTS: Final = "constraints.txt"
"""The exact versions the dependencies are installed at, within the ranges ``pyproject.toml`` gives."""
USER: Final = 65532
HOME: Final = "var/lib/nodetaskd"
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


def write_layer(tree: Path, tar_path: Path) -> None:
    """``tree`` as a reproducible, uncompressed layer tar: sorted, one mtime, numeric owners, no PAX times."""
    mtime = source_epoch()

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
    run(
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
    key = cache_key(SUITE, BASE_PACKAGES, BASE_REVISION, DROPPED, USER, source_epoch())
    home = cache_dir() / f"base-{key}"
    layer, rootfs = home / "layer.tar", home / "rootfs"
    if layer.exists() and not refresh:
        return layer, rootfs
    log(f"extracting Debian {SUITE}'s {PYTHON} with mmdebstrap (cached in {home})")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    packages = home / "packages.tar"
    run(
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
    fixed_time = {**os.environ, "SOURCE_DATE_EPOCH": str(max(source_epoch(), 315532800))}
    run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", wheels, f"{source}{os.sep}"],
        what="pip wheel (nodetaskd)",
        env=fixed_time,
    )
    (built,) = wheels.glob("nodetaskd-*.whl")
    return built


def python_layers(work: Path, base_rootfs: Path, *, root: Path = ROOT, refresh: bool = False) -> tuple[Path, Path]:
    """The deps and app layers as tars, each cached by what goes into it.

    The deps layer is keyed by the ranges of the base install and the cloud extra in ``pyproject.toml``
    and by the exact versions in ``constraints.txt`` it is installed at (a dependency that file does not
    name is resolved again with ``refresh``), the app layer by the content of the tree's sources: a
    rebuild of an unchanged tree runs no pip at all.
    """
    deps_layer = cache_dir() / f"deps-{cache_key(_pins(root), _MANYLINUX, source_epoch())}.tar"
    app_layer = cache_dir() / f"app-{cache_key(_tree_digest(root), source_epoch())}.tar"
    if deps_layer.exists() and app_layer.exists() and not refresh:
        return deps_layer, app_layer
    built = wheel(work, root=root)
    target = work / "target"
    platforms = [arg for platform in _MANYLINUX for arg in ("--platform", platform)]
    log("installing the cloud extra's wheels for CPython 3.11 / manylinux x86_64 with pip")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-compile",
            "--no-warn-script-location",
            "--constraint",
            root / CONSTRAINTS,
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
        log(f"compiling the dependencies (cached in {deps_layer})")
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
    exact = [line.strip() for line in (root / CONSTRAINTS).read_text().splitlines()]
    ranges = sorted([*project["dependencies"], *project["optional-dependencies"]["cloud"]])
    return [*ranges, *sorted(line for line in exact if line and not line.startswith("#"))]


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
