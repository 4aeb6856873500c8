"""The ``scriptRunner`` processor: run an Operation's script on the device, only if the device allows it.

Closed by default: a script runs only with ``diagnosis.scripts.enabled``, and then only if its
SHA-256 is in ``diagnosis.scripts.allowedSha256`` (unless ``allowAny``): whoever may create an
Operation must not get a shell on every device.

How it runs (KubeDiag runs ``timeout <N>s /bin/sh <file> <args>`` and always reports success):

- The script is written to a fresh private directory (0700, under the agent's data directory or
  the system's temporary one), which is also its working directory and is removed afterwards,
  whatever happened.
- Its argv is its interpreter, its file and the values of ``argKeys`` in order: a ``#!`` line names
  the interpreter (read as the kernel reads it), otherwise it is ``/bin/sh`` as in KubeDiag. The
  file is never executed itself (no exec bit needed, no ``noexec`` mount trouble) and no argument
  goes through a shell string. A key of ``argKeys`` that the request lacks fails the run (KubeDiag
  drops it silently, shifting the other arguments).
- It runs under a keeper process (:mod:`.reaper`, a child subreaper): when the script exits, or the
  timeout or a cancellation stops the run, every process the script started is killed (SIGKILL)
  and reaped, those that called ``setsid`` or double-forked included, so nothing it started
  outlives the run. A keeper that does not finish within :data:`STOP_GRACE` is killed with its
  process group.
- Arguments arrive as argv, but the script decides how to use them: it must quote them (``"$1"``,
  never ``$1``, which the shell splits and globs) and end options before them (``cmd -- "$1"``), or
  a parameter can still add options to the commands it runs (docs/security.md).
- Exit status 0 is success, with stdout (at most ``maxOutputBytes``, the rest read and dropped)
  under ``operation.<operationResultKey>.output`` (KubeDiag's key; ``script.output`` without an
  ``operationResultKey``). Any other status is failure, with the status and the tail of stderr.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import anyio
import anyio.abc
import anyio.to_thread

from nodetask.names import clip
from roles.common.config import ScriptsConfig
from roles.edge.processors.env import Log
from roles.edge.processors.outcome import REASON_CHARS, ProcessorOutcome, failed
from schemas.processors import ScriptRunner

__all__ = ["DEFAULT_RESULT_KEY", "refusal", "result_key", "run_script", "script_argv"]

DEFAULT_RESULT_KEY: Final = "script.output"
"""Where stdout goes when the scriptRunner has no ``operationResultKey``."""
SCRIPTS_DIR: Final = "diagnosis-scripts"
"""Under the agent's data directory: where each run gets its private directory."""
STDERR_TAIL: Final = 4 << 10
"""How many bytes of the end of stderr are kept for a failure's reason."""
DRAIN_GRACE: Final = 1.0
"""Seconds the pipes may stay open once the keeper has exited (nothing of the run holds them by then)."""
STOP_GRACE: Final = 5.0
"""Seconds the keeper has to kill and reap the run after being told to stop, before it is killed itself."""
REAPER: Final = Path(__file__).with_name("reaper.py")
"""The keeper, run by the agent's interpreter, isolated (``-I -S``: standard library only)."""
_SHELL: Final = "/bin/sh"


def refusal(script: str, config: ScriptsConfig) -> str | None:
    """Why ``config`` does not let ``script`` run, naming the setting that would; None if it may."""
    if not config.enabled:
        return "scripts are disabled on this device (diagnosis.scripts.enabled is false)"
    if config.allow_any:
        return None
    digest = hashlib.sha256(script.encode()).hexdigest()
    if digest not in {d.lower() for d in config.allowed_sha256}:
        return (
            f"the script's SHA-256 {digest} is not in diagnosis.scripts.allowedSha256 of this device"
            " (and diagnosis.scripts.allowAny is false)"
        )
    return None


def result_key(runner: ScriptRunner) -> str:
    """The results key of the script's stdout (KubeDiag's ``operation.<operationResultKey>.output``)."""
    return f"operation.{runner.operation_result_key}.output" if runner.operation_result_key else DEFAULT_RESULT_KEY


def script_argv(script: str, path: str, arg_keys: Sequence[str], request: Mapping[str, str]) -> list[str]:
    """The command line that runs ``script`` saved at ``path`` with the values of ``arg_keys``.

    A ``#!`` first line is read as Linux reads it: the interpreter, then at most one argument (the
    rest of the line, spaces included). Without one, ``/bin/sh`` runs the file.

    Errors: :class:`KeyError` naming the first key of ``arg_keys`` missing from ``request``.
    """
    missing = next((k for k in arg_keys if k not in request), None)
    if missing is not None:
        raise KeyError(missing)
    head = script.split("\n", 1)[0]
    if head.startswith("#!"):
        interpreter, _, argument = head[2:].strip(" \t\r").replace("\t", " ").partition(" ")
        argument = argument.strip(" ")
        command = [interpreter, argument] if argument else [interpreter]
    else:
        command = [_SHELL]
    return [*command, path, *(request[k] for k in arg_keys)]


def _prepare(script: str, data_dir: Path | None) -> Path:
    """A new private directory holding the script as ``script``; the directory is returned."""
    parent: Path | None = None
    if data_dir is not None:
        parent = data_dir / SCRIPTS_DIR
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="run-", dir=parent))  # mode 0700
    try:
        fd = os.open(directory / "script", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(script)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory


async def run_script(
    runner: ScriptRunner,
    request: Mapping[str, str],
    config: ScriptsConfig,
    *,
    data_dir: Path | None,
    log: Log,
) -> ProcessorOutcome:
    """Run ``runner``'s script if ``config`` allows it; see the module docstring.

    Cancellation: kills the script's process group and reaps the script before propagating.
    """
    if (why := refusal(runner.script, config)) is not None:
        return failed(why)
    try:
        directory = await anyio.to_thread.run_sync(_prepare, runner.script, data_dir)
    except OSError as exc:
        return failed(f"the script could not be written to a private directory: {exc}")
    try:
        path = directory / "script"
        try:
            argv = script_argv(runner.script, str(path), runner.arg_keys, request)
        except KeyError as exc:
            return failed(
                f"scriptRunner.argKeys names {exc.args[0]!r}, which is not in the request data"
                " (the Diagnosis parameters, the task's keys and the results of earlier stages)"
            )
        return await _execute(argv, cwd=directory, runner=runner, max_output=config.max_output_bytes, log=log)
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(shutil.rmtree, directory, True)


class _Output:
    """What is kept of one pipe: its head (stdout) or its tail (stderr), and how much there was."""

    def __init__(self, limit: int, *, keep_tail: bool) -> None:
        self.limit = limit
        self.keep_tail = keep_tail
        self.kept = bytearray()
        self.total = 0

    async def drain(self, stream: anyio.abc.ByteReceiveStream) -> None:
        # Read to the end even past the limit, so that a chatty script never blocks on a full pipe.
        with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
            async for chunk in stream:
                self.total += len(chunk)
                if self.keep_tail:
                    self.kept += chunk
                    del self.kept[: max(0, len(self.kept) - self.limit)]
                elif len(self.kept) < self.limit:
                    self.kept += chunk[: self.limit - len(self.kept)]

    def text(self) -> str:
        text = self.kept.decode("utf-8", errors="replace")
        if self.total > len(self.kept) and not self.keep_tail:
            text += f"\n... (output clipped at {self.limit} bytes: {self.total} bytes in all)"
        return text


def _kill_group(process: anyio.abc.Process) -> None:
    # The keeper leads its group (start_new_session), and stays unreaped until waited for below.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _status(control: socket.socket) -> str:
    """The keeper's report, read once it has exited (so all of it is there); empty if it wrote none."""
    control.setblocking(False)
    report = bytearray()
    with contextlib.suppress(BlockingIOError, ConnectionError):
        while chunk := control.recv(4096):
            report += chunk
    return report.decode(errors="replace").strip()


async def _execute(argv: list[str], *, cwd: Path, runner: ScriptRunner, max_output: int, log: Log) -> ProcessorOutcome:
    control, keeper_end = socket.socketpair()
    with control:
        try:
            with keeper_end:
                process = await anyio.open_process(
                    [sys.executable, "-I", "-S", str(REAPER), *argv],
                    stdin=keeper_end.fileno(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    start_new_session=True,
                )
        except OSError as exc:
            return failed(f"the script's keeper could not be started ({sys.executable}): {exc.strerror or exc}")
        stdout = _Output(max_output, keep_tail=False)
        stderr = _Output(STDERR_TAIL, keep_tail=True)
        assert process.stdout is not None
        assert process.stderr is not None
        try:
            async with anyio.create_task_group() as readers:
                readers.start_soon(stdout.drain, process.stdout)
                readers.start_soon(stderr.drain, process.stderr)
                # The keeper exits once the script has, and everything it started is killed and reaped.
                keeper_code = await process.wait()
                readers.cancel_scope.deadline = anyio.current_time() + DRAIN_GRACE
            report = _status(control)
        finally:
            with anyio.CancelScope(shield=True):
                if process.returncode is None:
                    # Timed out or cancelled: the end of file on its socket tells the keeper to stop.
                    with contextlib.suppress(OSError):
                        control.shutdown(socket.SHUT_RDWR)
                    log.info("diagnosis_script_stopping", pid=process.pid)
                    with anyio.move_on_after(STOP_GRACE):
                        await process.wait()
                    if process.returncode is None:
                        log.warning("diagnosis_script_keeper_killed", pid=process.pid, grace_s=STOP_GRACE)
                        _kill_group(process)
                        await process.wait()
                await process.aclose()
    verb, _, detail = report.partition(" ")
    if verb == "unstarted":
        return failed(f"the script could not be started ({argv[0]}): {detail}")
    if verb not in ("exited", "signalled") or not detail.lstrip("-").isdigit():
        tail = clip(stderr.text().strip()[-REASON_CHARS:], REASON_CHARS) or "(nothing on stderr)"
        return failed(f"the script's keeper failed (exit status {keeper_code}, report {report[:80]!r}): {tail}")
    code = int(detail) if verb == "exited" else -int(detail)
    log.debug("diagnosis_script_exited", code=code, stdout_bytes=stdout.total, stderr_bytes=stderr.total)
    if code == 0:
        return ProcessorOutcome(succeeded=True, results={result_key(runner): stdout.text()})
    tail = clip(stderr.text().strip()[-REASON_CHARS:], REASON_CHARS) or "(nothing on stderr)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return failed(f"the script was killed by {name}: {tail}")
    return failed(f"the script exited with status {code}: {tail}")
