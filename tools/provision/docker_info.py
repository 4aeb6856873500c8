#!/usr/bin/env python3
"""What a node's kubelet asks of Docker at its start, answered, so that it starts in one second instead of six.

The kubelet's cAdvisor (1.20) looks for Docker's root directory at every start, whatever the runtime: it asks
Docker's ``info`` five times a second apart before it falls back to ``--docker-root``. The test and demo nodes
have no Docker (their runtime is containerd), so each start of their kubelets waited those five seconds. This
answers on a unix socket (the kubelet's ``--docker``) with the root cAdvisor would fall back to anyway and a
version it refuses, so the kubelet goes on exactly as without Docker, minus the wait::

    python3 tools/provision/docker_info.py SOCKET

Standard library only: it runs as a script, until it is killed.
"""

from __future__ import annotations

import http.server
import json
import os
import socketserver
import sys
from pathlib import Path
from typing import Any, Final

DOCKER_ROOT: Final = "/var/lib/docker"
"""The kubelet's ``--docker-root`` default, where cAdvisor falls back to when Docker does not answer."""
VERSION: Final = {"Version": "0.0.0", "ApiVersion": "1.40", "MinAPIVersion": "1.12"}
"""Below cAdvisor's minimum (1.0): it registers no Docker container factory, as when Docker is absent."""
INFO: Final = {"DockerRootDir": DOCKER_ROOT, "ServerVersion": VERSION["Version"], "Driver": ""}


class _Answers(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path.endswith("/_ping"):
            self._send(200, "OK", "text/plain")
        elif path.endswith("/info"):
            self._send(200, json.dumps(INFO), "application/json")
        elif path.endswith("/version"):
            self._send(200, json.dumps(VERSION), "application/json")
        else:
            refusal = {"message": "not Docker: only info and version are answered"}
            self._send(404, json.dumps(refusal), "application/json")

    do_HEAD = do_GET

    def _send(self, status: int, body: str, content_type: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Api-Version", VERSION["ApiVersion"])
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        connection, _ = super().get_request()
        return connection, ("localhost", 0)  # http.server wants a (host, port) client address


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: docker_info.py SOCKET", file=sys.stderr)
        return 2
    socket = Path(argv[0])
    socket.unlink(missing_ok=True)  # left by a power cut
    with _Server(str(socket), _Answers) as server:
        os.chmod(socket, 0o600)
        print(f"docker_info: answering on {socket}", flush=True)
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
