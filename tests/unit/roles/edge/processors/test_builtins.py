"""The builtin collectors on the real host, their request keys, and their pure parts."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from roles.common.config import DiagnosisConfig
from roles.edge import processors
from roles.edge.processors import tail
from roles.edge.processors.node_collectors import ProcessSample, top_processes
from roles.edge.processors.probe import Probe, parse_targets, probe_outcome
from roles.edge.processors.request_keys import RequestError, json_list
from roles.edge.processors.tail import allowed_path, last_lines
from schemas.processors import BUILTIN_PROCESSORS, Builtin, Processor
from tests.unit.roles.edge.processors.doubles import make_env
from tools.ports import held

LOOPBACK = "127.0.0.1"


def builtin(name: str) -> Processor:
    return Processor(builtin=Builtin(name=name), timeout_seconds=20)


async def test_node_resources_reports_cpu_memory_and_disks_of_this_host() -> None:
    """The documented keys are there, with this host's values where they can be checked."""
    outcome = await processors.run(builtin("node.resources"), {}, make_env())
    assert outcome.succeeded, outcome.reason
    results = outcome.results
    assert results["node.resources.cpu.count"] == str(os.cpu_count())
    assert 0 <= float(results["node.resources.cpu.percent"]) <= 100
    assert int(results["node.resources.memory.available"]) <= int(results["node.resources.memory.total"])
    assert len(results["node.resources.load"].split()) == 3
    disks = msgspec.json.decode(results["node.resources.disks"])
    assert len(disks) == int(results["node.resources.disks.count"])
    assert all("mountpoint" in d for d in disks)


async def test_node_processes_lists_the_top_n_by_cpu_and_by_memory() -> None:
    """``node.processes.top`` sets N; each list is at most N long and sorted, highest first."""
    outcome = await processors.run(builtin("node.processes"), {"node.processes.top": "3"}, make_env())
    assert outcome.succeeded, outcome.reason
    assert int(outcome.results["node.processes.count"]) >= 1
    by_memory = msgspec.json.decode(outcome.results["node.processes.top.memory"])
    by_cpu = msgspec.json.decode(outcome.results["node.processes.top.cpu"])
    assert 1 <= len(by_memory) <= 3
    assert len(by_cpu) == len(by_memory)
    assert [p["rssBytes"] for p in by_memory] == sorted((p["rssBytes"] for p in by_memory), reverse=True)
    assert [p["cpuPercent"] for p in by_cpu] == sorted((p["cpuPercent"] for p in by_cpu), reverse=True)


@pytest.mark.parametrize(
    ("value", "reason"),
    [("many", "node.processes.top 'many' is not an integer"), ("0", "node.processes.top 0 is not within 1..50")],
)
async def test_a_bad_request_key_fails_naming_it(value: str, reason: str) -> None:
    """A collector's setting that does not parse is a failure naming the key, not a crash."""
    outcome = await processors.run(builtin("node.processes"), {"node.processes.top": value}, make_env())
    assert not outcome.succeeded
    assert outcome.reason == f"node.processes: {reason}"


async def test_agent_status_reports_the_agents_own_keys() -> None:
    """Each key of the agent's status appears under agent.status."""
    env = make_env(agent_status={"version": "1.2.3", "outboxDepth": "0"})
    outcome = await processors.run(builtin("agent.status"), {}, env)
    assert outcome.results == {"agent.status.version": "1.2.3", "agent.status.outboxDepth": "0"}


async def test_an_unknown_builtin_fails_listing_the_known_ones() -> None:
    """A name the device does not have is named in the failure with the ones it has."""
    outcome = await processors.run(builtin("node.magic"), {}, make_env())
    assert not outcome.succeeded
    assert outcome.reason == f"builtin.name 'node.magic' is not one of {', '.join(BUILTIN_PROCESSORS)}"


# --------------------------------------------------------------------------------------- network.probe


@pytest.fixture
def listening() -> Iterator[int]:
    """A loopback port with a listener (connections complete in the kernel's backlog)."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        sock.listen(8)
        yield int(sock.getsockname()[1])


@pytest.fixture
def refused() -> Iterator[int]:
    """A loopback port held, not listening, for the test: connecting to it is refused."""
    with held() as port:
        yield port


async def test_a_probe_of_a_target_that_does_not_answer_fails_the_task_by_default(listening: int, refused: int) -> None:
    """With require=all (the default) one refused target fails the Task; the results still say what was found."""
    down = refused
    request = {"network.probe.targets": f"localhost:{listening}, {LOOPBACK}:{down}"}
    with trio.fail_after(20):
        env = make_env(loopback_ports=(listening, down))
        outcome = await processors.run(builtin("network.probe"), request, env)
    assert not outcome.succeeded
    assert outcome.reason == (
        f"1 of 2 targets answered (network.probe.require is all): {LOOPBACK}:{down}: connect failed: connection refused"
    )
    results = outcome.results
    assert results[f"network.probe.localhost:{listening}.result"] == "ok"
    assert float(results[f"network.probe.localhost:{listening}.connectMs"]) >= 0
    assert float(results[f"network.probe.localhost:{listening}.dnsMs"]) >= 0
    assert results[f"network.probe.{LOOPBACK}:{down}.result"] == "connect failed: connection refused"
    assert results["network.probe.reachable"] == "1/2"


async def test_a_probe_with_require_any_succeeds_when_one_target_answers(listening: int, refused: int) -> None:
    """require=any passes with one of two; require=none passes with none."""
    down = refused
    env = make_env(loopback_ports=(listening, down))
    with trio.fail_after(20):
        some = await processors.run(
            builtin("network.probe"),
            {"network.probe.targets": f"{LOOPBACK}:{listening},{LOOPBACK}:{down}", "network.probe.require": "any"},
            env,
        )
        none = await processors.run(
            builtin("network.probe"),
            {"network.probe.targets": f"[::1]:{down}", "network.probe.require": "none"},
            env,
        )
    assert some.succeeded, some.reason
    assert none.succeeded, none.reason
    assert none.results[f"network.probe.[::1]:{down}.result"].startswith("connect failed")


async def test_a_probe_without_targets_fails_naming_the_key() -> None:
    """network.probe.targets is required; a malformed entry is named."""
    missing = await processors.run(builtin("network.probe"), {}, make_env())
    bad = await processors.run(builtin("network.probe"), {"network.probe.targets": "a:1,nope"}, make_env())
    assert "network.probe.targets" in missing.reason
    assert (
        bad.reason == "network.probe: network.probe.targets: 'nope' is not host:port (an IPv6 address as [addr]:port)"
    )


hosts = st.one_of(
    st.from_regex(r"[a-z][a-z0-9-]{0,20}(\.[a-z][a-z0-9-]{0,10}){0,3}", fullmatch=True),
    st.ip_addresses().map(str),
)


@given(st.lists(st.tuples(hosts, st.integers(min_value=1, max_value=65535)), min_size=1, max_size=32, unique=True))
def test_targets_round_trip_through_their_text(targets: list[tuple[str, int]]) -> None:
    """host:port entries, IPv6 in brackets, come back as given, in order."""
    text = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in targets)
    assert parse_targets(text) == tuple(targets)


@given(st.lists(st.booleans(), min_size=1, max_size=8), st.sampled_from(["all", "any", "none"]))
def test_the_probe_verdict_follows_require(reachable: list[bool], require: str) -> None:
    """all: every target answered; any: at least one; none: always; the count is in the results."""
    probes = tuple(
        Probe(target=f"h{i}:1", connect_ms=1.0) if ok else Probe(target=f"h{i}:1", error="connect failed: x")
        for i, ok in enumerate(reachable)
    )
    outcome = probe_outcome(probes, require)
    expected = {"all": all(reachable), "any": any(reachable), "none": True}[require]
    assert outcome.succeeded == expected
    assert outcome.results["network.probe.reachable"] == f"{sum(reachable)}/{len(reachable)}"


# ------------------------------------------------------------------------------------------- file.tail


async def test_file_tail_is_refused_unless_the_config_lists_directories(tmp_path: Path) -> None:
    """Closed by default: the refusal names diagnosis.tailDirs."""
    (tmp_path / "log").write_text("secret\n")
    outcome = await processors.run(builtin("file.tail"), {"file.tail.path": str(tmp_path / "log")}, make_env())
    assert not outcome.succeeded
    assert "diagnosis.tailDirs" in outcome.reason
    assert "secret" not in outcome.reason


async def test_file_tail_returns_the_last_lines_of_a_file_under_an_allowed_directory(tmp_path: Path) -> None:
    """The last file.tail.lines lines, with the resolved path and the file's size."""
    logs = tmp_path / "logs"
    logs.mkdir()
    text = "".join(f"line {i}\n" for i in range(500))
    (logs / "app.log").write_text(text)
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(logs),)))
    request = {"file.tail.path": str(logs / "app.log"), "file.tail.lines": "3"}
    outcome = await processors.run(builtin("file.tail"), request, env)
    assert outcome.succeeded, outcome.reason
    assert outcome.results == {
        "file.tail.path": str(logs / "app.log"),
        "file.tail.size": str(len(text)),
        "file.tail.lineCount": "3",
        "file.tail.content": "line 497\nline 498\nline 499",
    }


async def test_file_tail_resolves_links_and_dot_dots_before_the_check(tmp_path: Path) -> None:
    """A symlink inside an allowed directory pointing out of it, or a ../ path, is refused naming where it leads."""
    logs, private = tmp_path / "logs", tmp_path / "private"
    logs.mkdir()
    private.mkdir()
    (private / "key").write_text("secret\n")
    (logs / "link").symlink_to(private / "key")
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(logs),)))
    for path in (logs / "link", f"{logs}/../private/key"):
        outcome = await processors.run(builtin("file.tail"), {"file.tail.path": str(path)}, env)
        assert not outcome.succeeded
        assert f"(resolved: '{private / 'key'}') is not under any directory of diagnosis.tailDirs" in outcome.reason
        assert "secret" not in outcome.reason


async def test_file_tail_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    """A FIFO would block a reader forever: it is refused without waiting."""
    os.mkfifo(tmp_path / "pipe")
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(tmp_path),)))
    with trio.fail_after(10):
        outcome = await processors.run(builtin("file.tail"), {"file.tail.path": str(tmp_path / "pipe")}, env)
    assert outcome.reason == f"file.tail.path '{tmp_path / 'pipe'}' is not a regular file"


async def test_file_tail_of_a_large_file_keeps_whole_lines_only(tmp_path: Path) -> None:
    """Only the file's last 64 KiB are read; a line cut by that start is left out."""
    long_line = "x" * 100_000
    (tmp_path / "big.log").write_text(f"{long_line}\nlast\n")
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(tmp_path),)))
    outcome = await processors.run(builtin("file.tail"), {"file.tail.path": str(tmp_path / "big.log")}, env)
    assert outcome.results["file.tail.content"] == "last"


async def test_file_tail_refuses_a_file_with_more_than_one_hard_link(tmp_path: Path) -> None:
    """A hard link in an allowed directory to a file elsewhere would carry that file in: such a file is not read."""
    logs, private = tmp_path / "logs", tmp_path / "private"
    logs.mkdir()
    private.mkdir()
    (private / "key").write_text("secret\n")
    os.link(private / "key", logs / "app.log")
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(logs),)))
    outcome = await processors.run(builtin("file.tail"), {"file.tail.path": str(logs / "app.log")}, env)
    assert not outcome.succeeded
    assert outcome.reason == (
        f"file.tail.path '{logs / 'app.log'}' has 2 hard links: one of them may lie outside diagnosis.tailDirs,"
        " so file.tail reads only files with a single link"
    )
    assert outcome.results == {}


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/logs/app\x00.log", "holds a NUL byte, which no path can"),
        ("/logs/\ud800.log", "is not a file name this device can spell"),
    ],
)
async def test_file_tail_of_a_path_no_file_can_have_fails_naming_why(tmp_path: Path, path: str, why: str) -> None:
    """A NUL byte or a lone surrogate in the path is a failed Task with a reason, not an error out of the collector."""
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(tmp_path),)))
    outcome = await processors.run(builtin("file.tail"), {"file.tail.path": f"{tmp_path}{path}"}, env)
    assert not outcome.succeeded
    assert outcome.reason.startswith("file.tail: file.tail.path ")
    assert outcome.reason.endswith(why)


def test_a_directory_swapped_for_a_link_after_the_check_is_not_followed(tmp_path: Path) -> None:
    """Resolved and checked, then a directory on the path becomes a link out: the open stops there, naming it."""
    logs, private = tmp_path / "logs", tmp_path / "private"
    (logs / "app").mkdir(parents=True)
    private.mkdir()
    (logs / "app" / "x.log").write_text("public\n")
    (private / "x.log").write_text("secret\n")
    resolved = os.path.realpath(logs / "app" / "x.log")
    os.close(tail.open_resolved(resolved))
    (logs / "app").rename(logs / "app.old")
    (logs / "app").symlink_to(private)
    with pytest.raises(tail.PathChanged) as raised:
        tail.open_resolved(resolved)
    assert raised.value.args == (str(logs / "app"),)
    (logs / "app").unlink()
    (logs / "app").symlink_to(private / "x.log")  # not a directory: a link where a directory was
    with pytest.raises(tail.PathChanged):
        tail.open_resolved(resolved)


async def test_file_tail_racing_a_directory_swapped_for_a_link_never_reads_out_nor_raises(tmp_path: Path) -> None:
    """While a thread keeps swapping a directory on the path for a link to a private one and back, every run ends
    in the file's own lines or a failure with a reason: never the private file, never an exception."""
    logs, private = tmp_path / "logs", tmp_path / "private"
    (logs / "app").mkdir(parents=True)
    private.mkdir()
    (logs / "app" / "x.log").write_text("public\n")
    (private / "x.log").write_text("secret\n")
    env = make_env(config=DiagnosisConfig(tail_dirs=(str(logs),)))
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            (logs / "app").rename(logs / "app.real")
            (logs / "app").symlink_to(private)
            (logs / "app").unlink()
            (logs / "app.real").rename(logs / "app")

    swapper = threading.Thread(target=swap)
    swapper.start()
    outcomes = []
    request = {"file.tail.path": f"{logs}/app/x.log"}
    try:
        for _ in range(300):
            outcomes.append(await processors.run(builtin("file.tail"), request, env))  # noqa: PERF401 (awaits)
    finally:
        stop.set()
        swapper.join()
    assert all(o.results.get("file.tail.content", "public") == "public" for o in outcomes)
    assert all(o.succeeded or o.reason.startswith("file.tail.path ") for o in outcomes)
    assert not any("secret" in o.reason for o in outcomes)


line_text = st.text(alphabet=st.characters(blacklist_categories=("Cc", "Zl", "Zp", "Cs")), max_size=30)


@given(st.lists(line_text, max_size=50), st.integers(min_value=1, max_value=60))
def test_last_lines_of_a_whole_file_are_its_last_n(lines: list[str], n: int) -> None:
    """Read from the start, the file's last n lines are returned as they are."""
    data = "".join(f"{line}\n" for line in lines).encode()
    assert last_lines(data, n, whole=True) == lines[-n:]


@given(st.sampled_from(["/var/log", "/srv"]), st.from_regex(r"[a-z./]{0,20}", fullmatch=True))
def test_a_path_is_allowed_only_strictly_inside_a_listed_directory(directory: str, rest: str) -> None:
    """A sibling sharing a prefix (/var/log2) is not inside /var/log; the directory itself is not a file in it."""
    path = os.path.normpath(f"{directory}/{rest}") if rest else directory
    inside = path.startswith(f"{directory}/")
    assert allowed_path(path, (directory,)) == inside
    assert not allowed_path(f"{directory}2/x", (directory,))


# --------------------------------------------------------------------------------------- shared parts


@given(st.lists(st.integers(), max_size=40), st.integers(min_value=2, max_value=200))
def test_json_lists_keep_the_longest_prefix_that_fits(items: list[int], limit: int) -> None:
    """The text is valid JSON of a prefix, within the limit, and one item more would not fit."""
    text, shown = json_list(items, limit)
    assert msgspec.json.decode(text) == items[:shown]
    assert len(text.encode()) <= limit
    if shown < len(items):
        assert len(msgspec.json.encode(items[: shown + 1])) > limit


samples = st.builds(
    ProcessSample,
    pid=st.integers(min_value=1, max_value=10**6),
    name=st.just("p"),
    user=st.just("u"),
    cpu_percent=st.floats(min_value=0, max_value=800, allow_nan=False),
    rss_bytes=st.integers(min_value=0, max_value=2**40),
)


@given(st.lists(samples, max_size=30, unique_by=lambda s: s.pid), st.integers(min_value=1, max_value=10))
def test_top_processes_are_the_highest_n_in_order(found: list[ProcessSample], n: int) -> None:
    """Each list has min(n, all) processes; none left out uses more than the last one kept."""
    by_cpu, by_memory = top_processes(found, n)
    assert len(by_cpu) == len(by_memory) == min(n, len(found))
    for kept, key in ((by_cpu, _cpu), (by_memory, _rss)):
        assert [key(p) for p in kept] == sorted((key(p) for p in kept), reverse=True)
        if kept:
            assert all(key(p) <= key(kept[-1]) for p in found if p not in kept)


def _cpu(p: ProcessSample) -> float:
    return p.cpu_percent


def _rss(p: ProcessSample) -> float:
    return p.rss_bytes


def test_request_errors_are_value_errors_naming_the_key() -> None:
    """Collectors raise RequestError; builtins turn it into a failure."""
    with pytest.raises(RequestError, match=r"network\.probe\.targets"):
        parse_targets(",,")


def test_every_builtin_the_api_accepts_has_a_collector() -> None:
    """The webhook admits the names in BUILTIN_PROCESSORS; each must run on the device."""
    from roles.edge.processors.builtins import _COLLECTORS

    assert tuple(_COLLECTORS) == BUILTIN_PROCESSORS
