"""What a kubelet upgrade does to the kubelet itself: ask a binary its version, restart the kubelet under its
supervisor, and wait until it is healthy again.

Every call has its own bound (a cancel scope); a failure is a reason to report, never an exception.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.to_thread
import msgspec

from flows.nodejobs.kubelet_health import node_problem
from nodetask.names import clip
from roles.common.edge_config import KubeletConfig
from schemas.core import Node

__all__ = ["ReadNode", "binary_version", "restart", "restart_and_prove", "wait_healthy"]

ReadNode = Callable[[], Awaitable[Mapping[str, Any] | None]]
"""The device's own Node as its cache holds it (the kubelet's status updates pass through the node API)."""

COMMAND_TIMEOUT: Final = 60.0
_VERSION_TEXT: Final = re.compile(r"v[0-9][0-9A-Za-z.+_-]{0,127}")
POLL_SECONDS: Final = 1.0


async def _run(argv: Sequence[str]) -> tuple[int, str]:
    """Exit status and output (stdout, then stderr) of ``argv``, bounded by :data:`COMMAND_TIMEOUT`."""
    with anyio.move_on_after(COMMAND_TIMEOUT):
        try:
            done = await anyio.run_process(list(argv), check=False)
        except OSError as exc:
            return -1, str(exc)
        return done.returncode, (done.stdout + done.stderr).decode(errors="replace").strip()
    return -1, f"still running after {COMMAND_TIMEOUT:g}s"


async def binary_version(binary: Path) -> tuple[str, str]:
    """(version, "") as ``binary --version`` prints it (``Kubernetes v1.20.2`` gives ``v1.20.2``), or ("", why)."""
    status, output = await _run([str(binary), "--version"])
    words = output.split()
    # The version names a backup directory: nothing but a version's characters.
    if status != 0 or len(words) != 2 or words[0] != "Kubernetes" or not _VERSION_TEXT.fullmatch(words[1]):
        return "", f"{binary} --version exited {status} saying {clip(output, 200)!r}, not 'Kubernetes <version>'"
    return words[1], ""


async def restart(command: Sequence[str]) -> str:
    """Run the kubelet's restart command; "" when it succeeded, else why not (naming the setting)."""
    status, output = await _run(command)
    if status == 0:
        return ""
    return f"kubelet.restartCommand {list(command)} exited {status}: {clip(output, 300)}"


def _healthz(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            body = answer.read(200).decode(errors="replace").strip()
            return "" if answer.status == 200 and body == "ok" else f"{url} answered {answer.status} {body!r}"
    except urllib.error.HTTPError as exc:
        return f"{url} answered {exc.code}"
    except OSError as exc:
        return f"{url} does not answer: {exc}"


async def wait_healthy(healthz_url: str, read_node: ReadNode, *, version: str, since: datetime, within: float) -> str:
    """Wait until the kubelet answers ``healthz`` and its Node is Ready at ``version``, posted after ``since``.

    "" once it is, else (after ``within`` seconds) the last thing that was wrong."""
    problem = "not checked yet"
    with anyio.move_on_after(within):
        while True:
            problem = await anyio.to_thread.run_sync(_healthz, healthz_url)
            if not problem:
                raw = await read_node()
                try:
                    node = None if raw is None else msgspec.convert(raw, Node)
                except msgspec.ValidationError as exc:
                    problem = f"the device's Node object is malformed: {exc}"
                else:
                    problem = node_problem(node, version=version, since=since)
                if not problem:
                    return ""
            await anyio.sleep(POLL_SECONDS)
    return f"the kubelet was not healthy within {within:g}s: {problem}"


async def _next_whole_second() -> datetime:
    now = datetime.now(UTC)
    await anyio.sleep(1 - now.microsecond / 1e6)
    return max(datetime.now(UTC), (now + timedelta(seconds=1)).replace(microsecond=0))


async def restart_and_prove(settings: KubeletConfig, read_node: ReadNode | None, version: str) -> str:
    """Restart the kubelet and wait ``healthDeadline`` for it healthy at ``version``: "" or why it is not."""
    # The restart begins on a whole second, taken as ``since``: the Node's heartbeats have whole seconds, and the
    # new kubelet posts its status once as it starts, maybe before the restart command has even returned; every
    # post of its is then in that second or later, every earlier post of the old one's before it.
    since = await _next_whole_second()
    if problem := await restart(settings.restart_command):
        return problem
    if read_node is None:
        return "this agent cannot read its Node (no cache): the kubelet's health cannot be judged"
    return await wait_healthy(
        settings.healthz_url, read_node, version=version, since=since, within=settings.health_deadline
    )
