"""Real OCI registries (Debian ``docker-registry``) on loopback, open or with basic or token auth, and pushing
test images to them (:mod:`tools.provision.containerd` says why and how they are used). Stdlib only."""

from __future__ import annotations

import base64
import contextlib
import json
import secrets
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tools import ports
from tools.provision import controlplane as _cp
from tools.provision.runtime_processes import (
    Process,
    RuntimeServicesError,
    Tools,
    ensure_tools,
    prepare_dir,
    run,
    spawn,
    wait_until,
)


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
    process: Process
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
        policy = self._policy()
        if not layout.exists():
            run([str(tools.umoci), "init", "--layout", str(layout)], what="umoci init")
        local = f"img-{secrets.token_hex(6)}"  # umoci tags are local and must be unique
        payload = work / f"{local}.txt"
        payload.write_bytes(content if content is not None else f"{name}:{tag} {secrets.token_hex(16)}\n".encode())
        image = f"{layout}:{local}"
        run([str(tools.umoci), "new", "--image", image], what="umoci new")
        run([str(tools.umoci), "insert", "--image", image, str(payload), "/nodetaskd.txt"], what="umoci insert")
        ref = f"{self.host}/{name}:{tag}"
        argv = [str(tools.skopeo), "--policy", str(policy), "copy", "--quiet", "--dest-tls-verify=false"]
        if self.requires_auth:
            argv.append(f"--dest-creds={self.username}:{self.password}")
        run([*argv, f"oci:{image}", f"docker://{ref}"], what=f"skopeo copy to {ref}")
        payload.unlink()
        return ref

    def push_archive(self, archive: Path, name: str, tag: str = "latest") -> str:
        """Push the one image of OCI archive ``archive`` (``tools/provision/node_images.py``'s) as ``name:tag``;
        returns the image reference ``{host}/{name}:{tag}``."""
        tools = self.tools = self.tools or ensure_tools()
        ref = f"{self.host}/{name}:{tag}"
        argv = [str(tools.skopeo), "--policy", str(self._policy()), "copy", "--quiet", "--dest-tls-verify=false"]
        if self.requires_auth:
            argv.append(f"--dest-creds={self.username}:{self.password}")
        run([*argv, f"oci-archive:{archive}", f"docker://{ref}"], what=f"skopeo copy of {archive} to {ref}")
        return ref

    def _policy(self) -> Path:
        """skopeo insists on a signature policy; ours accepts anything, and so never reads /etc."""
        policy = self.state_dir / "images" / "policy.json"
        if not policy.exists():
            policy.parent.mkdir(exist_ok=True)
            _cp._write_atomic(policy, json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
        return policy

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
    state_dir = prepare_dir(state_dir)
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
        line = run(
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
    process = spawn(
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
        wait_until(f"docker-registry on {host}", process, lambda: _registry_answers(host))
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


__all__ = ["Registry", "TokenAuth", "start_registry"]
