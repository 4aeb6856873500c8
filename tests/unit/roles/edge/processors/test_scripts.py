"""The scriptRunner processor: closed by default, allowed by digest, argv only, and nothing outlives its run."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from roles.common.config import DiagnosisConfig, ScriptsConfig
from roles.edge import processors
from roles.edge.processors.scripts import DEFAULT_RESULT_KEY, REAPER, SCRIPTS_DIR, refusal, script_argv
from schemas.processors import Processor, ScriptRunner
from tests.unit.roles.edge.processors.doubles import make_env


def digest(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()


def allowing(*scripts: str, max_output: int = 64 << 10) -> DiagnosisConfig:
    """A config that runs exactly ``scripts``."""
    return DiagnosisConfig(
        scripts=ScriptsConfig(
            enabled=True, allowed_sha256=tuple(digest(s) for s in scripts), max_output_bytes=max_output
        )
    )


def script(text: str, *, arg_keys: tuple[str, ...] = (), key: str | None = "disk", timeout: int = 20) -> Processor:
    return Processor(
        script_runner=ScriptRunner(script=text, arg_keys=arg_keys, operation_result_key=key), timeout_seconds=timeout
    )


async def wait_dead(pid: int) -> None:
    """Return once ``pid`` has ended: its pidfd turns readable then (SIGKILL is delivered asynchronously)."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)


def reaped(pid: int) -> bool:
    """Whether this process's child ``pid`` has been waited for (no zombie of it is left)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def files_named(root: Path, name: str) -> list[Path]:
    return list(root.rglob(name))


ECHO = 'printf "%s|" "$@"\n'


async def test_a_script_is_refused_by_default(tmp_path: Path) -> None:
    """Without diagnosis.scripts.enabled no script runs, and the reason names that setting."""
    marker = tmp_path / "ran"
    outcome = await processors.run(script(f"touch {marker}\n"), {}, make_env(data_dir=tmp_path))
    assert not outcome.succeeded
    assert "diagnosis.scripts.enabled" in outcome.reason
    assert not marker.exists()


async def test_a_script_whose_digest_is_not_listed_is_refused_naming_it(tmp_path: Path) -> None:
    """Enabled, a script runs only if its SHA-256 is listed; the refusal names the digest and the settings."""
    text = f"touch {tmp_path / 'ran'}\n"
    outcome = await processors.run(script(text), {}, make_env(config=allowing("echo other\n"), data_dir=tmp_path))
    assert not outcome.succeeded
    assert digest(text) in outcome.reason
    assert "diagnosis.scripts.allowedSha256" in outcome.reason
    assert "diagnosis.scripts.allowAny" in outcome.reason
    assert not (tmp_path / "ran").exists()


async def test_an_allowed_script_gets_arg_values_as_argv_never_through_a_shell(tmp_path: Path) -> None:
    """The values of argKeys arrive in order, verbatim; stdout is the result under operation.<key>.output."""
    request = {"b": "$(touch pwned); echo x", "a": "two words", "unused": "z"}
    outcome = await processors.run(
        script(ECHO, arg_keys=("a", "b")), request, make_env(config=allowing(ECHO), data_dir=tmp_path)
    )
    assert outcome.succeeded, outcome.reason
    assert outcome.results == {"operation.disk.output": "two words|$(touch pwned); echo x|"}
    assert not files_named(tmp_path, "pwned")


async def test_a_script_without_result_key_puts_stdout_under_the_default_key(tmp_path: Path) -> None:
    """Without operationResultKey the output is under script.output; a #! line picks the interpreter."""
    text = "#!/usr/bin/env python3\nimport sys\nprint('py', sys.argv[1:])\n"
    outcome = await processors.run(
        script(text, arg_keys=("x",), key=None), {"x": "1"}, make_env(config=allowing(text), data_dir=tmp_path)
    )
    assert outcome.succeeded, outcome.reason
    assert outcome.results == {DEFAULT_RESULT_KEY: "py ['1']\n"}


async def test_a_missing_arg_key_fails_naming_it(tmp_path: Path) -> None:
    """KubeDiag drops a missing key and shifts the others; here the run fails and names the key."""
    outcome = await processors.run(
        script(ECHO, arg_keys=("a", "nope")), {"a": "1"}, make_env(config=allowing(ECHO), data_dir=tmp_path)
    )
    assert not outcome.succeeded
    assert "scriptRunner.argKeys names 'nope'" in outcome.reason


async def test_a_non_zero_exit_fails_with_the_status_and_the_tail_of_stderr(tmp_path: Path) -> None:
    """KubeDiag reports success whatever the script did; here exit 3 is a failure quoting stderr's end."""
    text = 'i=0; while [ $i -lt 200 ]; do echo "noise $i" >&2; i=$((i+1)); done\necho "disk is full" >&2\nexit 3\n'
    outcome = await processors.run(script(text), {}, make_env(config=allowing(text), data_dir=tmp_path))
    assert not outcome.succeeded
    assert outcome.reason.startswith("the script exited with status 3: ")
    assert outcome.reason.endswith("disk is full")
    assert "noise 0\n" not in outcome.reason
    assert len(outcome.reason) < 600


async def test_a_script_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    """A script that dies of a signal fails naming the signal."""
    text = "kill -SEGV $$\n"
    outcome = await processors.run(script(text), {}, make_env(config=allowing(text), data_dir=tmp_path))
    assert not outcome.succeeded
    assert outcome.reason.startswith("the script was killed by SIGSEGV")


async def test_the_timeout_kills_the_whole_process_group_and_removes_the_script(tmp_path: Path) -> None:
    """On timeout the script and the grandchild it started are SIGKILLed; its private directory is gone."""
    text = 'sleep 300 &\necho $! > "$1"\necho $$ > "$2"\nwait\n'
    grandchild, child = tmp_path / "grandchild.pid", tmp_path / "child.pid"
    with trio.fail_after(30):
        outcome = await processors.run(
            script(text, arg_keys=("g", "c"), timeout=1),
            {"g": str(grandchild), "c": str(child)},
            make_env(config=allowing(text), data_dir=tmp_path),
        )
        assert outcome.reason == "timed out after 1 s (the operation's timeoutSeconds)"
        # The script itself was reaped by the run: no zombie of it is left to this process.
        assert reaped(int(child.read_text()))
        await wait_dead(int(grandchild.read_text()))
    assert list((tmp_path / SCRIPTS_DIR).iterdir()) == []


async def test_what_a_successful_script_leaves_running_is_killed_with_it(tmp_path: Path) -> None:
    """A background process that holds stdout open would otherwise hold the run until its timeout."""
    text = 'sleep 300 &\necho $! > "$1"\necho done\n'
    pid_file = tmp_path / "pid"
    with trio.fail_after(15):
        outcome = await processors.run(
            script(text, arg_keys=("p",), timeout=60), {"p": str(pid_file)}, make_env(config=allowing(text))
        )
        await wait_dead(int(pid_file.read_text()))
    assert outcome.succeeded, outcome.reason
    assert outcome.results == {"operation.disk.output": "done\n"}


def alive(pid: int) -> bool:
    """Whether ``pid`` exists, a zombie included (a process reaped by its parent does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_if_alive(pid: int) -> None:
    """Tidy up after a run that let ``pid`` escape (a failing test must not leave it running)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# Each starts `sleep 300` in a new session, which writes its pid to "$1" first, and waits until it has.
LEFT_THE_GROUP = {
    "setsid": 'setsid sh -c \'echo $$ > "$0"; exec sleep 300\' "$1" &\n',
    "double fork": '(setsid sh -c \'echo $$ > "$0"; exec sleep 300\' "$1" &)\n',
}
WAIT_FOR_PID = 'while [ ! -s "$1" ]; do sleep 0.05; done\n'


@pytest.mark.parametrize("how", sorted(LEFT_THE_GROUP))
@pytest.mark.parametrize("ending", ["exit", "timeout"])
async def test_a_process_that_left_the_script_group_is_dead_and_reaped_when_the_run_returns(
    tmp_path: Path, how: str, ending: str
) -> None:
    """A daemon the script started with setsid (or a double fork) is no longer in its process group, yet it is
    killed and reaped before run() returns, whether the script exited or timed out."""
    text = LEFT_THE_GROUP[how] + WAIT_FOR_PID + ("echo started\n" if ending == "exit" else "sleep 300\n")
    pid_file = tmp_path / "daemon.pid"
    try:
        with trio.fail_after(30):
            outcome = await processors.run(
                script(text, arg_keys=("p",), timeout=60 if ending == "exit" else 2),
                {"p": str(pid_file)},
                make_env(config=allowing(text), data_dir=tmp_path),
            )
        daemon = int(pid_file.read_text())
        assert not alive(daemon)
    finally:
        if pid_file.exists():
            kill_if_alive(int(pid_file.read_text()))
    if ending == "exit":
        assert outcome.results == {"operation.disk.output": "started\n"}
    else:
        assert outcome.reason == "timed out after 2 s (the operation's timeoutSeconds)"


async def test_a_keeper_whose_agent_went_away_kills_the_run_and_exits(tmp_path: Path) -> None:
    """The end of file on the keeper's socket (the agent closed it, or died) stops the run: the script and
    the daemon it left are killed and reaped, and the keeper exits."""
    text = LEFT_THE_GROUP["double fork"] + WAIT_FOR_PID + "echo waiting\nsleep 300\n"
    pid_file = tmp_path / "daemon.pid"
    agent, keeper_end = socket.socketpair()
    with keeper_end:
        keeper = await trio.lowlevel.open_process(
            [sys.executable, "-I", "-S", str(REAPER), "/bin/sh", "-c", text, "sh", str(pid_file)],
            stdin=keeper_end.fileno(),
            stdout=subprocess.PIPE,
        )
    try:
        with trio.fail_after(30):
            assert keeper.stdout is not None
            assert await keeper.stdout.receive_some() == b"waiting\n"
            agent.close()
            assert await keeper.wait() == 0
        assert not alive(int(pid_file.read_text()))
    finally:
        agent.close()
        kill_if_alive(int(pid_file.read_text()))
        if keeper.returncode is None:
            keeper.kill()
            with trio.CancelScope(shield=True):
                await keeper.wait()
        assert keeper.stdout is not None
        await keeper.stdout.aclose()


async def test_a_script_reads_nothing_from_stdin_and_runs_with_default_signal_dispositions(tmp_path: Path) -> None:
    """Its stdin is /dev/null (never the keeper's socket to the agent), and SIGPIPE is not ignored as in Python."""
    text = "cat\nawk '/^SigIgn/ {print $2}' /proc/$$/status\n"
    with trio.fail_after(30):
        outcome = await processors.run(script(text), {}, make_env(config=allowing(text), data_dir=tmp_path))
    assert outcome.succeeded, outcome.reason
    ignored = int(outcome.results["operation.disk.output"], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1))


async def test_output_beyond_the_cap_is_dropped_and_the_result_says_so(tmp_path: Path) -> None:
    """stdout is kept up to maxOutputBytes; the script still finishes (its pipe never fills)."""
    text = "head -c 300000 /dev/zero | tr '\\0' 'x'\necho\necho end >&2\n"
    outcome = await processors.run(
        script(text), {}, make_env(config=allowing(text, max_output=1024), data_dir=tmp_path)
    )
    assert outcome.succeeded, outcome.reason
    value = outcome.results["operation.disk.output"]
    assert value == "x" * 1024 + "\n... (output clipped at 1024 bytes: 300001 bytes in all)"


async def test_a_script_that_cannot_start_fails_naming_its_interpreter(tmp_path: Path) -> None:
    """A #! line naming a missing interpreter is a failure, not a crash."""
    text = "#!/nonexistent/interpreter\n"
    outcome = await processors.run(script(text), {}, make_env(config=allowing(text), data_dir=tmp_path))
    assert not outcome.succeeded
    assert "the script could not be started (/nonexistent/interpreter)" in outcome.reason


# ------------------------------------------------------------------------------------------ pure parts

keys = st.text(min_size=1, max_size=8)


@given(st.dictionaries(keys, st.text(), max_size=6), st.data())
def test_argv_is_the_interpreter_the_file_and_the_values_in_order(request: dict[str, str], data: st.DataObject) -> None:
    """Whatever the values hold, each is one argv element, in argKeys order, after the file."""
    arg_keys = data.draw(st.lists(st.sampled_from(sorted(request)), max_size=5)) if request else []
    argv = script_argv("echo\n", "/run/x/script", arg_keys, request)
    assert argv == ["/bin/sh", "/run/x/script", *(request[k] for k in arg_keys)]


@given(st.dictionaries(keys, st.text(), max_size=4), keys)
def test_argv_of_a_missing_key_raises_naming_it(request: dict[str, str], key: str) -> None:
    """A key the request lacks is named, never skipped."""
    if key in request:
        return
    with pytest.raises(KeyError) as raised:
        script_argv("echo\n", "/s", (*request, key), request)
    assert raised.value.args[0] == key


@pytest.mark.parametrize(
    ("head", "command"),
    [
        ("#!/bin/bash", ["/bin/bash"]),
        ("#! /usr/bin/env python3", ["/usr/bin/env", "python3"]),
        ("#!/usr/bin/awk -f", ["/usr/bin/awk", "-f"]),
        ("#!/usr/bin/env -S a b", ["/usr/bin/env", "-S a b"]),
        ("#!/bin/sh\t-e  ", ["/bin/sh", "-e"]),
        ("echo no shebang", ["/bin/sh"]),
    ],
)
def test_a_shebang_is_read_as_the_kernel_reads_it(head: str, command: list[str]) -> None:
    """The interpreter, then at most one argument: the rest of the line."""
    assert script_argv(f"{head}\nbody\n", "/s", (), {}) == [*command, "/s"]


@given(st.text(max_size=200), st.booleans(), st.booleans(), st.booleans())
def test_only_an_enabled_config_lets_a_listed_or_any_script_run(
    text: str, enabled: bool, listed: bool, allow_any: bool
) -> None:
    """The refusal decision, and that each refusal names the setting that would allow it."""
    config = ScriptsConfig(
        enabled=enabled, allowed_sha256=(digest(text).upper(),) if listed else (), allow_any=allow_any
    )
    why = refusal(text, config)
    assert (why is None) == (enabled and (listed or allow_any))
    if not enabled:
        assert why is not None
        assert "diagnosis.scripts.enabled" in why
    elif why is not None:
        assert digest(text) in why
        assert "diagnosis.scripts.allowedSha256" in why


def test_the_config_refuses_a_digest_that_is_not_sha256_hex() -> None:
    """A typo in allowedSha256 is an error at start, naming the setting."""
    with pytest.raises(ValueError, match=r"diagnosis\.scripts\.allowedSha256: 'abc'"):
        ScriptsConfig(allowed_sha256=("abc",))
