"""Processes a benchmark runs or watches: the edge fleet, and CPU/memory readings by PID."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

import anyio
import anyio.abc
import psutil
from anyio.streams.buffered import BufferedByteReceiveStream

from bench.cluster import REPO
from bench.waits import Stalled


def cpu_seconds(pids: Mapping[str, int]) -> dict[str, float]:
    """User + system CPU seconds used so far by each named process (children not included)."""
    out: dict[str, float] = {}
    for name, pid in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        out[name] = t.user + t.system
    return out


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    return {name: after[name] - before[name] for name in after if name in before}


def rss_bytes(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


class Fleet:
    """A running ``bench.fleet`` process; see that module for its line protocol."""

    def __init__(self, process: anyio.abc.Process, count: int) -> None:
        self.process = process
        self.count = count
        assert process.stdout is not None
        self._out = BufferedByteReceiveStream(process.stdout)
        self.pid = process.pid

    @classmethod
    async def spawn(
        cls,
        *,
        url: str,
        seed: str,
        count: int,
        delay: float = 0.01,
        jitter: float = 0.0,
        parallel: int = 200,
        pings: bool = False,
        cache: bool = False,
        lean: bool = False,
    ) -> Fleet:
        argv: list[str] = [
            sys.executable, "-m", "bench.fleet", f"--url={url}", f"--seed={seed}", f"--count={count}",
            f"--delay={delay}", f"--jitter={jitter}", f"--parallel={parallel}",
        ]  # fmt: skip
        if pings:
            argv.append("--pings")
        if cache:
            argv.append("--cache")
        if lean:
            argv.append("--lean")
        process = await anyio.open_process(argv, cwd=REPO, stderr=subprocess.DEVNULL)
        fleet = cls(process, count)
        await fleet.expect("started", limit_s=30)
        return fleet

    async def expect(self, event: str, *, limit_s: float) -> dict[str, Any]:
        """The next line whose event is ``event`` (other lines are skipped).

        Raises :class:`~bench.waits.Stalled` naming the event after ``limit_s`` seconds, or once the
        fleet process has ended without saying it.
        """
        with anyio.move_on_after(limit_s):
            while True:
                try:
                    line = await self._out.receive_until(b"\n", 1 << 20)
                except (anyio.EndOfStream, anyio.IncompleteRead):
                    await self.process.wait()
                    raise Stalled(
                        f"the fleet of {self.count} edges exited (status {self.process.returncode}) before {event!r}"
                    ) from None
                msg: dict[str, Any] = json.loads(line)
                if msg.get("event") == event:
                    return msg
        raise Stalled(f"waited {limit_s:.0f} s for the fleet of {self.count} edges to say {event!r}")

    async def command(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(line.encode() + b"\n")

    async def aclose(self) -> None:
        """End of input stops the fleet; kill it if it lingers."""
        with anyio.CancelScope(shield=True):
            assert self.process.stdin is not None
            await self.process.stdin.aclose()
            with anyio.move_on_after(10):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
            await self.process.aclose()


def wall() -> float:
    return time.perf_counter()
