"""The command line of :mod:`tools.provision.containerd`: a containerd and two registries that outlive the
command, recorded in a state file. Stdlib only."""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from tools.provision import controlplane as _cp
from tools.provision.containerd_server import Containerd, start_containerd
from tools.provision.registry import Registry, start_registry
from tools.provision.runtime_processes import Process, RuntimeServicesError, Tools, ensure_tools, log

STATE_FILE: Final = "runtime.json"
"""Marker + record of services started by the CLI inside its state directory."""


def default_state_dir() -> Path:
    """State directory of the CLI: ``$NODETASKD_RUNTIME_DIR`` or ``~/.cache/nodetaskd/runtime``."""
    env = os.environ.get("NODETASKD_RUNTIME_DIR")
    return Path(env).expanduser().resolve() if env else _cp.cache_dir() / "runtime"


def _record(state_dir: Path, ctd: Containerd, open_reg: Registry, auth_reg: Registry) -> None:
    def proc(p: Process) -> dict[str, object]:
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

        def proc(name: str, entry: dict[str, object]) -> Process:
            return Process(
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
            log(f"already running (state {state_dir})")
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
    log(f"started in {time.monotonic() - started:.1f}s (state and logs in {state_dir})")
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
        log(f"nothing to stop (no state in {state_dir})")
        return 0
    _stop_all(state_dir)
    log("stopped")
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


__all__ = ["STATE_FILE", "default_state_dir", "main"]
