"""Simulated kubelets' steady traffic as tunnels through one hub: ``python -m bench.tunnel_fleet --url ws://...``.

Each edge is a bare websocket client (the helpers of :mod:`bench.lean_edge`) speaking the session
protocol: its Hello lists ``tunnel.v1`` and pings; once welcomed it opens one request tunnel (the
kubelet's keep-alive connection) and ``--watches`` watch tunnels (held open), then every
``--lease-s`` seconds (from a random phase) sends a lease renewal on the request tunnel and waits
for its answer, and every ``--status-s`` seconds a node status update; websocket pings every
heartbeat interval, as the agent. The bytes are not TLS: they are :mod:`bench.api_standin`'s
simulated requests, of the sizes a kubelet's requests and answers have inside TLS. Credit is given
back as the agent gives it (every quarter window read).

JSON lines on stdout: ``{"event": "ready", ...}`` once every edge has its tunnels open; then for each
``stats`` line on stdin, the requests answered since the last ``stats`` and their round trips (ms).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import statistics
import sys
import time
import urllib.parse
from dataclasses import dataclass, field

import trio

from bench import api_standin
from bench.cluster import edge_token, node_name
from bench.fleet import raise_fd_limit
from bench.lean_edge import _BINARY, _PING, client_frame, server_frames
from nodetask import messages
from nodetask.messages import PING_CAPABILITY, TUNNEL_CAPABILITY, Hello, TunnelCredit, TunnelOpen, Welcome
from nodetask.tunnel import WINDOW, data_frame, is_data, read_data


@dataclass(frozen=True, slots=True)
class Traffic:
    watches: int
    lease_s: float
    status_s: float
    lease: tuple[int, int]
    """Bytes of a lease renewal and of its answer."""
    status: tuple[int, int]
    watch: tuple[int, int]
    """Bytes of a watch request and of its answer (and of each bookmark)."""


@dataclass(slots=True, eq=False)
class TunnelEdge:
    node: str
    host: str
    port: int
    token: str
    traffic: Traffic
    times: list[float]
    opened: int = 0
    _sock: trio.socket.SocketType | None = None
    _lock: trio.StrictFIFOLock = field(default_factory=trio.StrictFIFOLock)
    _waiting: dict[int, trio.Event] = field(default_factory=dict)
    _received: dict[int, int] = field(default_factory=dict)
    _unthanked: dict[int, int] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    """Why the hub could not open tunnels it was asked for (each asked again)."""
    _refused: dict[int, str] = field(default_factory=dict)
    _numbers: int = 0
    _request_tunnel: int = 0
    _want: int = 0
    _answered: trio.Event = field(default_factory=trio.Event)

    async def _send(self, frame: bytes) -> None:
        assert self._sock is not None
        async with self._lock:
            view = memoryview(frame)
            while view:
                view = view[await self._sock.send(view) :]

    async def _message(self, msg: messages.Message) -> None:
        await self._send(client_frame(_BINARY, messages.encode(msg)))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        key = base64.b64encode(os.urandom(16)).decode()
        sock = self._sock = trio.socket.socket()
        await sock.connect((self.host, self.port))
        await sock.send(
            f"GET /nodes/{self.node} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
            f"Authorization: Bearer {self.token}\r\n\r\n".encode()
        )
        buffer = bytearray()
        while b"\r\n\r\n" not in buffer:
            buffer += await self._receive()
        head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            raise RuntimeError(f"{self.node}: {head.splitlines()[0]!r}")
        buffer = bytearray(rest)
        capabilities = (messages.ATTEMPTS_CAPABILITY, PING_CAPABILITY, TUNNEL_CAPABILITY)
        await self._message(Hello(node=self.node, version="v1.0.0", capabilities=capabilities))
        async with trio.open_nursery() as nursery:
            welcomed = trio.Event()
            nursery.start_soon(self._serve, buffer, welcomed)
            await welcomed.wait()
            t = self.traffic
            self._request_tunnel = await self._open()
            for _ in range(t.watches):
                await self._data(await self._open(), api_standin.request(b"W", *t.watch))
            task_status.started()
            nursery.start_soon(self._keepalive, self._interval)
            nursery.start_soon(self._requests)

    async def _open(self) -> int:
        """A new tunnel's number once the hub opened it; one it could not connect is asked again (counted)."""
        while True:
            self._numbers += 1
            number = self._numbers
            # Kept here: the reader pops it as the TunnelOpened comes, which may be before the send returns.
            opened = self._waiting[number] = trio.Event()
            await self._message(TunnelOpen(stream=number))
            await opened.wait()
            if number not in self._refused:
                self.opened += 1
                return number
            self.refused.append(self._refused.pop(number))
            await trio.sleep(1)

    async def _receive(self) -> bytes:
        assert self._sock is not None
        data = await self._sock.recv(65536)
        if not data:
            raise RuntimeError(f"{self.node}: closed by the hub")
        return data

    async def _data(self, number: int, payload: bytes) -> None:
        await self._send(client_frame(_BINARY, data_frame(number, payload)))

    async def _serve(self, buffer: bytearray, welcomed: trio.Event) -> None:
        while True:
            for _, payload in server_frames(buffer):
                if is_data(payload):
                    number, data = read_data(payload)
                    self._received[number] = self._received.get(number, 0) + len(data)
                    thanked = self._unthanked[number] = self._unthanked.get(number, 0) + len(data)
                    if thanked >= WINDOW // 4:
                        self._unthanked[number] = 0
                        await self._message(TunnelCredit(stream=number, size=thanked))
                    if number == self._request_tunnel and self._received[number] >= self._want:
                        self._answered.set()
                    continue
                if not payload:
                    continue  # a pong
                msg = messages.decode_downstream(payload)
                if isinstance(msg, Welcome):
                    self._interval = msg.heartbeat_interval
                    welcomed.set()
                elif isinstance(msg, messages.TunnelOpened):
                    self._waiting.pop(msg.stream).set()
                elif isinstance(msg, messages.TunnelClose) and msg.stream in self._waiting:
                    self._refused[msg.stream] = msg.reason
                    self._waiting.pop(msg.stream).set()
                elif isinstance(msg, messages.TunnelClose):
                    raise RuntimeError(f"{self.node}: tunnel {msg.stream} closed: {msg.reason}")
            buffer += await self._receive()

    _interval: float = 15.0

    async def _keepalive(self, interval: float) -> None:
        while True:
            await trio.sleep(interval)
            await self._send(client_frame(_PING, b""))

    async def _requests(self) -> None:
        t = self.traffic
        await trio.sleep(random.uniform(0, t.lease_s))
        next_status = trio.current_time() + random.uniform(0, t.status_s)
        while True:
            started = trio.current_time()
            await self._request(*t.lease)
            if trio.current_time() >= next_status:
                next_status += t.status_s
                await self._request(*t.status)
            await trio.sleep_until(started + t.lease_s)

    async def _request(self, size: int, answer: int) -> None:
        self._answered = trio.Event()
        self._want = self._received.get(self._request_tunnel, 0) + answer
        started = time.perf_counter()
        await self._data(self._request_tunnel, api_standin.request(b"R", size, answer))
        await self._answered.wait()
        self.times.append(time.perf_counter() - started)


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    url = urllib.parse.urlsplit(args.url)
    if url.hostname is None or url.port is None:
        raise SystemExit(f"--url takes ws://host:port, not {args.url!r}")
    traffic = Traffic(
        watches=args.watches, lease_s=args.lease_s, status_s=args.status_s,
        lease=(args.lease_bytes, args.lease_answer_bytes), status=(args.status_bytes, args.status_answer_bytes),
        watch=(args.watch_bytes, args.bookmark_bytes),
    )  # fmt: skip
    times: list[float] = []
    edges = [
        TunnelEdge(node_name(i), url.hostname, url.port, edge_token(args.seed, node_name(i)), traffic, times)
        for i in range(args.count)
    ]
    limiter = trio.CapacityLimiter(args.parallel)
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:

        async def start(edge: TunnelEdge) -> None:
            # A hub refuses a session until it has seen the token (its watch may lag the start): retry.
            for attempt in range(5):
                async with limiter:
                    try:
                        await nursery.start(edge.run)
                        return
                    except (OSError, RuntimeError) as exc:
                        if attempt == 4:
                            raise RuntimeError(f"{edge.node}: {exc}") from exc
                await trio.sleep(1 + attempt)

        async with trio.open_nursery() as starting:
            for edge in edges:
                starting.start_soon(start, edge)
        refused = [reason for e in edges for reason in e.refused]
        emit(
            "ready", count=len(edges), tunnels=sum(e.opened for e in edges), seconds=time.perf_counter() - started,
            refused=len(refused), refused_first=refused[:3],
        )  # fmt: skip
        mark = time.perf_counter()
        async for line in trio.wrap_file(sys.stdin):
            if line.strip() == "stats":
                now, taken = time.perf_counter(), sorted(times)
                times.clear()
                median = round(statistics.median(taken) * 1000, 3) if taken else 0.0
                p99 = round(taken[int(len(taken) * 0.99)] * 1000, 3) if taken else 0.0
                emit("stats", requests=len(taken), seconds=now - mark, median_ms=median, p99_ms=p99)
                mark = now
        nursery.cancel_scope.cancel()


def main() -> None:
    p = argparse.ArgumentParser(prog="bench.tunnel_fleet", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--url", required=True)
    p.add_argument("--seed", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--watches", type=int, default=6)
    p.add_argument("--lease-s", type=float, default=10.0)
    p.add_argument("--status-s", type=float, default=60.0)
    p.add_argument("--lease-bytes", type=int, default=700)
    p.add_argument("--lease-answer-bytes", type=int, default=800)
    p.add_argument("--status-bytes", type=int, default=1500)
    p.add_argument("--status-answer-bytes", type=int, default=3500)
    p.add_argument("--watch-bytes", type=int, default=400)
    p.add_argument("--bookmark-bytes", type=int, default=300)
    p.add_argument("--parallel", type=int, default=200)
    args = p.parse_args()
    raise_fd_limit()
    trio.run(serve, args)


if __name__ == "__main__":
    main()
