"""Where the hub's CPU goes during the bursts of a hub-capacity run: py-spy samples and their summary.

``python -m bench.run --only hub --profile-hub 1000`` runs one more hub-capacity size with py-spy
(``--py-spy``, else the one on PATH) attached to the hub process during the connect storm, the
heartbeat, ping and report bursts, and the reconnect storm (the restarted hub, from its start).
The sampler runs beside the hub (``--nonblocking``: it never stops the process) and costs a core
of its own, so the profiled run's figures are not reported; the samples are. They
are kept as collapsed stacks (``profile-hub-<N>-<phase>.txt`` beside the results) with a summary
at the top: the functions the hub spent its time in (self), the ones under which it did
(inclusive), and the share of each area (trio, the websocket layers, the hub's own code, ...).
Idle samples (the hub waiting in epoll) are left out by py-spy, so shares are of busy time.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import anyio

__all__ = ["Sampler", "find_py_spy", "sampler", "shorten", "summarize"]

Sampler = Callable[[str, int], AbstractAsyncContextManager[None]]
"""Samples process ``pid`` during a phase named by the first argument, for the length of the block."""

RATE = 250
"""Samples a second."""
_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")
_AREAS: tuple[tuple[str, str], ...] = (
    ("trio_websocket/", "trio-websocket"),
    ("wsproto/", "wsproto + h11"),
    ("h11/", "wsproto + h11"),
    ("trio/", "trio"),
    ("anyio/", "anyio"),
    ("prometheus_client/", "prometheus_client"),
    ("structlog/", "structlog"),
    ("msgspec/", "msgspec"),
    ("nodetask/", "nodetask (codec, links)"),
    ("roles/cloud/", "roles/cloud (the hub)"),
    ("roles/kube/", "roles/kube + the API bridge"),
    ("trio_asyncio/", "roles/kube + the API bridge"),
    ("aiohttp/", "roles/kube + the API bridge"),
    ("asyncio/", "roles/kube + the API bridge"),
)


def find_py_spy(given: str | None) -> str | None:
    """The py-spy executable to use: ``given`` or the one on PATH; None when there is none."""
    return given or shutil.which("py-spy")


def sampler(py_spy: str, out_dir: Path, label: str) -> Sampler:
    """A :data:`Sampler` writing ``out_dir/profile-hub-<label>-<phase>.txt`` for each phase sampled."""

    @asynccontextmanager
    async def sample(phase: str, pid: int) -> AsyncIterator[None]:
        raw = out_dir / f"profile-hub-{label}-{phase}.raw"
        argv = [py_spy, "record", "--pid", str(pid), "--rate", str(RATE), "--nonblocking"]
        argv += ["--format", "raw", "--output", str(raw)]
        proc = await anyio.open_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = anyio.current_time()
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                seconds = anyio.current_time() - started
                proc.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
                with anyio.move_on_after(30):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
                await proc.aclose()
        if raw.exists():
            stacks = shorten(raw.read_text())
            title = f"py-spy of the hub process during the {phase} burst ({label}), {seconds:.1f} s at {RATE} Hz"
            (out_dir / f"profile-hub-{label}-{phase}.txt").write_text(summarize(stacks, title) + "\n" + stacks)
            raw.unlink()

    return sample


def shorten(stacks: str) -> str:
    """Collapsed stacks with each frame's file named from its package (no site-packages or checkout paths)."""
    out = []
    for frames, count in _parse(stacks):
        out.append(";".join(_short_line(f) for f in frames) + f" {count}")
    return "\n".join(out) + "\n"


def _short_line(frame: str) -> str:
    """``frame`` with its file shortened as :func:`_short` does, keeping the line number."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    line = frame[m.end("file") : -1]  # ":<line>", or nothing
    return _short(frame)[:-1] + line + ")"


def _parse(stacks: str) -> Iterable[tuple[list[str], int]]:
    for line in stacks.splitlines():
        path, _, count = line.rpartition(" ")
        if path.strip() and count.isdigit():
            yield path.split(";"), int(count)


def _short(frame: str) -> str:
    m = _FRAME.match(frame)
    if m is None:
        return frame
    file = m["file"]
    for marker in ("site-packages/", "/lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
    for marker in ("/roles/", "/nodetask/", "/bench/", "/flows/"):
        if marker in file:
            file = marker[1:] + file.split(marker, 1)[1]
    return f"{m['func']} ({file})"


def _area(frame: str) -> str:
    for marker, area in _AREAS:
        if f"({marker}" in frame or f"/{marker}" in frame:
            return area
    return "other (stdlib, interpreter)"


def summarize(stacks: str, title: str, *, top: int = 30) -> str:
    """The summary of py-spy's collapsed ``stacks``: self and inclusive shares by function, self by area."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for frames, count in _parse(stacks):
        names = [_short(f) for f in frames]
        total += count
        own[names[-1]] += count
        areas[_area(names[-1])] += count
        for name in set(names):
            under[name] += count
    if not total:
        return f"# {title}\n# no samples\n"

    def table(counts: Counter[str], n: int) -> list[str]:
        return [f"#   {c / total * 100:5.1f}%  {name}" for name, c in counts.most_common(n)]

    return "\n".join(
        [
            f"# {title}",
            f"# {total} busy samples (idle left out). Collapsed stacks (py-spy raw format) follow the summary.",
            "#",
            "# self time by area (the innermost frame's package):",
            *table(areas, len(areas)),
            "#",
            f"# self time, top {top} functions:",
            *table(own, top),
            "#",
            f"# inclusive time (the function or anything it called), top {top}:",
            *table(under, top),
            "",
        ]
    )
