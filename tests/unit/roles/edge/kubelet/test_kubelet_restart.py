"""A restarted kubelet is judged by the status it posts once as it starts, however quickly it does."""

from __future__ import annotations

import http.server
import sys
import threading
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from roles.common.edge_config import KubeletConfig
from roles.edge.kubelet.probe import restart_and_prove

VERSION = "v1.20.3"
POST_ON_START = "import datetime, sys; open(sys.argv[1], 'w').write(datetime.datetime.now(datetime.UTC).isoformat())"
"""The restart command: a kubelet that posts its status once, as it starts (the file holds when)."""


class _Healthz(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def healthz() -> Iterator[str]:
    """A healthz that answers ok (the restarted kubelet's), on loopback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


async def test_a_kubelet_posting_once_within_its_restarts_second_is_healthy(tmp_path: Path, healthz: str) -> None:
    """Its one post, in the very second the restart command ran (before the command even returned), counts: the
    Node's heartbeat has whole seconds and the kubelet does not post again for minutes."""
    posted = tmp_path / "posted"
    settings = KubeletConfig(
        restart_command=(sys.executable, "-c", POST_ON_START, str(posted)), healthz_url=healthz, health_deadline=3
    )

    async def read_node() -> Mapping[str, Any]:
        when = datetime.fromisoformat(posted.read_text())
        beat = when.replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": beat}
        return {"status": {"conditions": [ready], "nodeInfo": {"kubeletVersion": VERSION}}}

    for _ in range(3):  # each restart at a different time of its second
        assert await restart_and_prove(settings, read_node, VERSION) == ""
