"""The upgrade artifact from a registry that wants bearer tokens: a real docker-registry with ``auth: token``."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import anyio.to_thread
import pytest

from roles.edge.upgrade import artifact, registry_token
from roles.edge.upgrade.artifact import ArtifactError
from roles.edge.upgrade.registry_client import RegistryClient
from tests.integration.token_server import SERVICE, TokenRequest, TokenServer, token_server
from tools.provision import upgrade_artifact
from tools.provision.containerd import Registry, Tools, start_registry

GUARD_S = 60.0
"""Upper bound of each test's registry traffic (every HTTP call has its own 30 s timeout too)."""


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TokenServer]:
    """The token service the registry sends clients to."""
    with token_server(tmp_path_factory.mktemp("token-server")) as server:
        yield server


@pytest.fixture(scope="module")
def token_registry(
    tmp_path_factory: pytest.TempPathFactory, runtime_tools: Tools, tokens: TokenServer
) -> Iterator[Registry]:
    """A docker-registry that accepts only tokens of ``tokens``."""
    reg = start_registry(tmp_path_factory.mktemp("token-registry"), runtime_tools, token_auth=tokens.auth)
    try:
        yield reg
    finally:
        reg.stop()


def _push(registry: Registry, tokens: TokenServer, repository: str, version: str) -> str:
    push_token = tokens.issue(repository, ("pull", "push"), subject="test")
    return upgrade_artifact.push(f"{registry.host}/{repository}", version, token=push_token)


async def test_an_artifact_in_a_token_registry_is_resolved_and_installed(
    token_registry: Registry, tokens: TokenServer, tmp_path: Path
) -> None:
    """The 401 challenge leads to one anonymous pull token, which serves the manifest and the layer."""
    repository = "nodetaskd/agent"
    with anyio.fail_after(GUARD_S):
        digest = await anyio.to_thread.run_sync(_push, token_registry, tokens, repository, "v0.5.0")
        tokens.grants[repository] = frozenset({"pull"})
        tokens.requests.clear()

        resolved = await artifact.resolve(f"{token_registry.host}/{repository}", "v0.5.0")
        installed = await artifact.install(resolved, tmp_path / "versions", "v0.5.0")

    assert resolved.digest == digest
    assert (installed / "VERSION").read_text() == "v0.5.0\n"
    assert (installed / "roles" / "edge" / "upgrade" / "artifact.py").is_file()
    # The install reused the token the resolve fetched: one exchange, anonymous, for pulling only.
    assert tokens.requests == [
        TokenRequest(service=SERVICE, scopes=(f"repository:{repository}:pull",), authorization=False)
    ]


async def test_a_kept_token_the_registry_refuses_is_replaced_once(
    token_registry: Registry, tokens: TokenServer, tmp_path: Path
) -> None:
    """A token kept from the resolve that no longer works gets one fresh exchange, and the install goes on."""
    repository = "nodetaskd/rotated"
    with anyio.fail_after(GUARD_S):
        await anyio.to_thread.run_sync(_push, token_registry, tokens, repository, "v0.5.0")
        tokens.grants[repository] = frozenset({"pull"})
        resolved = await artifact.resolve(f"{token_registry.host}/{repository}", "v0.5.0")
        scope = registry_token.pull_scope(repository)
        resolved.tokens.put(token_registry.host, scope, "revoked", 300, asked_at=resolved.tokens.clock())
        tokens.requests.clear()

        installed = await artifact.install(resolved, tmp_path / "versions", "v0.5.0")

    assert (installed / "VERSION").read_text() == "v0.5.0\n"
    assert [r.scopes for r in tokens.requests] == [(f"repository:{repository}:pull",)]


async def test_an_artifact_the_token_service_will_not_grant_is_refused_naming_why(
    token_registry: Registry, tokens: TokenServer
) -> None:
    """A token without the pull action still gets 401: the error names the registry, realm and scope."""
    repository = "nodetaskd/private"
    with anyio.fail_after(GUARD_S):
        await anyio.to_thread.run_sync(_push, token_registry, tokens, repository, "v0.5.0")
        tokens.grants[repository] = frozenset({"pull"})
        await artifact.resolve(f"{token_registry.host}/{repository}", "v0.5.0")

        tokens.grants[repository] = frozenset()
        with pytest.raises(ArtifactError) as refused:
            await artifact.resolve(f"{token_registry.host}/{repository}", "v0.5.0")
    assert str(refused.value) == (
        f"upgrade artifact {token_registry.host}/{repository}:v0.5.0: registry {token_registry.host}"
        f" still answers 401 with the token from {tokens.realm} for repository:{repository}:pull:"
        " the repository is private or the token service grants no anonymous pull"
        " (the upgrade artifact is pulled anonymously)"
    )


async def test_a_token_service_answering_garbage_is_named_in_the_error(
    token_registry: Registry, tokens: TokenServer
) -> None:
    """An answer that is not JSON fails the resolve with the registry and the step that failed."""
    tokens.answer = b"<html>maintenance</html>"
    try:
        with (
            anyio.fail_after(GUARD_S),
            pytest.raises(ArtifactError, match=rf"registry {token_registry.host}: the token answer is not JSON$"),
        ):
            await artifact.resolve(f"{token_registry.host}/nodetaskd/agent", "v0.5.0")
    finally:
        tokens.answer = None


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Redirects ``/v2/`` paths to the URL in the server's ``target``, serves anything else, and records headers."""

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, _RecordingServer)
        server.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/v2/"):
            self.send_response(307)
            self.send_header("Location", server.target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(server.body)))
        self.end_headers()
        self.wfile.write(server.body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _RecordingServer(http.server.ThreadingHTTPServer):
    def __init__(self, body: bytes) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.body = body
        self.target = ""
        self.seen: list[tuple[str, str | None]] = []

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def two_origins() -> Iterator[tuple[_RecordingServer, _RecordingServer]]:
    """Two loopback HTTP servers on different ports (so different origins), each in its own thread."""
    servers = (_RecordingServer(b"layer bytes"), _RecordingServer(b"layer bytes"))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    try:
        yield servers
    finally:
        for server, thread in zip(servers, threads, strict=True):
            server.shutdown()
            server.server_close()
            thread.join()


@pytest.mark.parametrize("cross_origin", [True, False])
def test_the_registry_token_is_not_sent_where_a_blob_download_is_redirected(
    two_origins: tuple[_RecordingServer, _RecordingServer], tmp_path: Path, cross_origin: bool
) -> None:
    """A redirect to another host or port loses ``Authorization``; one to the registry itself keeps it."""
    registry, cdn = two_origins
    target = cdn if cross_origin else registry
    registry.target = f"{target.origin}/blobs/signed?sig=abc"
    host = registry.origin.removeprefix("http://")
    ref = artifact.reference(f"{host}/team/agent", "v1")
    tokens = registry_token.Tokens()
    tokens.put(host, registry_token.pull_scope("team/agent"), "T0KEN", 300, asked_at=tokens.clock())
    client = RegistryClient(ref, plain=True, insecure=(), tokens=tokens)
    layer = artifact.Descriptor("application/vnd.oci.image.layer.v1.tar", artifact.sha256(b"layer bytes"), 11)

    client.blob(layer.digest, layer.size, tmp_path / "blob")

    assert (tmp_path / "blob").read_bytes() == b"layer bytes"
    assert registry.seen[0] == (f"/v2/team/agent/blobs/{layer.digest}", "Bearer T0KEN")
    assert target.seen[-1] == ("/blobs/signed?sig=abc", None if cross_origin else "Bearer T0KEN")
