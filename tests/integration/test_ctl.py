"""``nodetaskd ctl`` as an operator runs it (a process, the admin's kubeconfig) on real jobs of real hubs."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import pytest
import yaml

from nodetask.phases import JobPhase
from roles.kube import Kube
from roles.kube.resources import job_resource
from schemas.core import CONFIRM_ANNOTATION, RETRY_ANNOTATION
from schemas.kinds import IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB
from tests.integration.agents import FakeRuntime, running_agent
from tests.integration.controlplane import ControlPlane
from tests.integration.fleet import register_edges
from tests.integration.hubs import light_edge, running_controller, running_edges, running_hub
from tests.integration.objects import create_job, job_when, kubectl, unique
from tools.processes import terminate

pytestmark = pytest.mark.integration

UPGRADES = job_resource(NODE_UPGRADE_JOB)
PREPULLS = job_resource(IMAGE_PRE_PULL_JOB)
JOB_LINE = re.compile(
    r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ imageprepulljob/\S+ phase=(\S+) nodes=(\d+) pending=(\d+) inProgress=(\d+)"
    r" successful=(\d+) failure=(\d+) unknown=(\d+)"
)


def _ctl(crds: ControlPlane, *args: str) -> list[str]:
    return [sys.executable, "-m", "roles.cli", "ctl", *args, f"--kubeconfig={crds.kubeconfig('admin')}"]


async def _run_ctl(crds: ControlPlane, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process(_ctl(crds, *args), check=False)


class Lines:
    """The lines a process writes to its stdout, read as they come."""

    def __init__(self, process: anyio.abc.Process) -> None:
        assert process.stdout is not None
        self._stream = process.stdout
        self._buffer = b""
        self.seen: list[str] = []

    async def next(self) -> str:
        while b"\n" not in self._buffer:
            self._buffer += await self._stream.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        self.seen.append(line.decode())
        return self.seen[-1]

    async def rest(self) -> list[str]:
        """Every line until the process closes its stdout."""
        try:
            while True:
                await self.next()
        except anyio.EndOfStream:
            return self.seen


async def test_watch_prints_a_line_per_change_off_a_terminal_and_exits_0_when_the_job_completes(
    crds: ControlPlane, cloud_kube: Kube
) -> None:
    """Started while the job waits for its edges, the watch prints each change once and ends with Completed, exit 0."""
    nodes = [unique("watched") for _ in range(2)]
    tokens = await register_edges(crds, nodes)
    name = unique("watch-ok")
    spec: dict[str, object] = {
        "imagePrePullTemplate": {"images": ["example/a:1"], "nodeNames": nodes, "concurrency": 1}
    }
    async with running_controller(crds), running_hub(crds, unique("hub-watch")) as hub:
        await create_job(crds, "ImagePrePullJob", name, spec)
        await job_when(cloud_kube, PREPULLS, name, lambda j: j.status.phase is JobPhase.IN_PROGRESS)
        watch = await anyio.open_process(_ctl(crds, "watch", name), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            lines = Lines(watch)
            # Three CLI processes start in here: on a loaded machine each takes seconds to import.
            with anyio.fail_after(180):
                first = await lines.next()  # the edges are not connected yet: nothing can move
                async with running_edges(light_edge(n, hub.url, tokens[n], delay=0.2) for n in nodes):
                    seen = await lines.rest()
                    status = await watch.wait()
        finally:
            await terminate(watch)
    job_lines = [JOB_LINE.match(line) for line in seen if " phase=" in line]
    assert all(job_lines), seen
    phases = [(m[1], int(m[3]), int(m[5])) for m in job_lines if m]
    assert JOB_LINE.match(first)
    assert phases[0] == ("InProgress", 2, 0)
    assert phases[-1] == ("Completed", 0, 2)
    assert all(a != b for a, b in itertools.pairwise(phases)), seen  # a line per change, none repeated
    assert status == 0


def _actions(job: Any, node: str) -> list[tuple[str, str]]:
    return [(a.action, a.status) for e in job.status.node_status if e.node_name == node for a in e.action_flow]


def _attempt(job: Any, node: str) -> int:
    return int(next(e.attempt for e in job.status.node_status if e.node_name == node))


async def test_confirm_releases_paused_nodes_and_watch_exits_1_when_the_job_fails(
    crds: ControlPlane, cloud_kube: Kube, tmp_path: Path
) -> None:
    """`ctl confirm` adds a node, then every node, to the annotation; the released upgrades fail (no launcher
    in-process), so `ctl watch -o json` ends on Failure with exit 1; `ctl describe` shows each node's row, and
    with `--phase` only those in that phase;
    `ctl retry` runs both again, paused for a fresh confirmation, and is refused while they run."""
    first, second = unique("gate-a"), unique("gate-b")
    tokens = await register_edges(crds, [first, second])
    name, hub_id = unique("gated"), unique("hub-gate")
    spec = {"version": "v1.2.3", "nodeNames": [first, second], "requireConfirmation": True, "concurrency": 2}
    paused = [("Check", "True"), ("WaitingConfirmation", "True")]
    async with (
        running_controller(crds),
        running_hub(crds, hub_id) as hub,
        running_agent(first, tokens[first], hub.url, tmp_path / "a", FakeRuntime()),
        running_agent(second, tokens[second], hub.url, tmp_path / "b", FakeRuntime()),
    ):
        await create_job(crds, "NodeUpgradeJob", name, spec)
        await job_when(cloud_kube, UPGRADES, name, lambda j: all(_actions(j, n) == paused for n in (first, second)))
        watch = await anyio.open_process(
            _ctl(crds, "watch", "-o", "json", f"nodeupgradejob/{name}"), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        try:
            lines = Lines(watch)
            # Three CLI processes start in here: on a loaded machine each takes seconds to import.
            with anyio.fail_after(180):
                opening = json.loads(await lines.next())
                one = await _run_ctl(crds, "confirm", name, first)
                annotated = (await cloud_kube.get(UPGRADES, name)).metadata.annotations.get(CONFIRM_ANNOTATION)
                every = await _run_ctl(crds, "confirm", name, "--all")
                seen = await lines.rest()
                status = await watch.wait()
        finally:
            await terminate(watch)
        described = await _run_ctl(crds, "describe", name)
        described_json = await _run_ctl(crds, "describe", name, "-o", "json")
        failures = await _run_ctl(crds, "describe", name, "--phase", "failure")
        successes = await _run_ctl(crds, "describe", name, "--phase", "Successful", "-o", "json")
        bad_phase = await _run_ctl(crds, "describe", name, "--phase", "Done")
        listed = await _run_ctl(crds, "get", "nodeupgradejob")
        # The retry takes the stale "*" away: without that, the retried upgrades would run on unconfirmed.
        retried = await _run_ctl(crds, "retry", f"nodeupgradejob/{name}")
        again = await job_when(
            cloud_kube,
            UPGRADES,
            name,
            lambda j: all(_actions(j, n) == paused and _attempt(j, n) == 2 for n in (first, second)),
        )
        too_soon = await _run_ctl(crds, "retry", name)

    assert opening["job"]["phase"] == "InProgress"
    assert opening["job"]["counts"]["inProgress"] == 2
    assert one.returncode == 0, one.stderr
    assert f"confirm annotation (none) -> {first}" in one.stdout.decode()
    assert f"paused at WaitingConfirmation now: {', '.join(sorted([first, second]))}" in one.stdout.decode()
    assert annotated == first
    assert every.returncode == 0
    assert f"confirm annotation {first} -> *" in every.stdout.decode()
    last = json.loads(seen[-1])
    assert last["job"]["phase"] == "Failure"
    assert last["job"]["counts"]["failure"] == 2
    assert status == 1

    assert described.returncode == 0, described.stderr
    rows = {
        line.split()[0]: line.split() for line in described.stdout.decode().splitlines() if line.startswith("gate-")
    }
    for node in (first, second):
        assert rows[node][:4] == [node, "Failure", "BackUp", "(False)"]
        assert rows[node][-2:] == [hub_id, "v0.1.0"]
    nodes = {n["node"]: n for n in json.loads(described_json.stdout)["nodes"]}
    assert nodes[first]["reason"].startswith("agent self-upgrade is not available")
    assert "Nodes in Failure: 2 of 2" in failures.stdout.decode(), failures.stdout
    assert {line.split()[0] for line in failures.stdout.decode().splitlines() if line.startswith("gate-")} == {
        first,
        second,
    }
    assert json.loads(successes.stdout)["nodes"] == []
    assert bad_phase.returncode == 2
    assert b"'Done' is not a node phase: one of Pending, InProgress, Successful, Failure, Unknown" in bad_phase.stderr
    (row,) = [line.split() for line in listed.stdout.decode().splitlines() if name in line]
    assert row[:4] == ["nodeupgradejob", name, "Failure", "2"]

    assert retried.returncode == 0, retried.stderr
    assert f"retry 1 asked for; 2 nodes run again: {', '.join(sorted([first, second]))}" in retried.stdout.decode()
    assert "confirm annotation * taken away" in retried.stdout.decode()
    assert again.metadata.annotations.get(RETRY_ANNOTATION) == "1"
    assert CONFIRM_ANNOTATION not in again.metadata.annotations
    assert too_soon.returncode == 2
    assert b"cannot be retried: the job is InProgress" in too_soon.stderr


async def test_ctl_refuses_what_does_not_apply_naming_it(crds: ControlPlane) -> None:
    """Confirming a job that cannot wait, naming no node, watching a job that does not exist: exit 2 with the reason."""
    name = unique("not-gated")
    await create_job(crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["a:1"], "nodeNames": ["x"]}})
    wrong_kind = await _run_ctl(crds, "confirm", name, "--all")
    missing = await _run_ctl(crds, "watch", unique("no-such-job"))
    ambiguous_kind = await _run_ctl(crds, "describe", f"nodejob/{name}")
    both = await _run_ctl(crds, "confirm", name, "x", "--all")
    assert (wrong_kind.returncode, missing.returncode, ambiguous_kind.returncode, both.returncode) == (2, 2, 2, 2)
    assert b"only NodeUpgradeJobs wait for a confirmation" in wrong_kind.stderr
    assert b"no job" in missing.stderr
    assert b"is not a node job kind" in ambiguous_kind.stderr
    assert b"name nodes or give --all, not both" in both.stderr


async def test_get_selects_by_label_and_prints_names_or_rows_without_headers(crds: ControlPlane) -> None:
    """`ctl get -l` lists only the labelled job; `-o name` prints KIND.GROUP/NAME, `--no-headers` a bare row and
    `-o wide` what the job does."""
    team = unique("team")
    chosen, other = unique("labelled"), unique("unlabelled")
    for name in (chosen, other):
        spec: dict[str, object] = {"imagePrePullTemplate": {"images": ["a:1"], "nodeNames": ["x"]}}
        await create_job(crds, "ImagePrePullJob", name, spec)
    await kubectl(crds, "label", "imageprepulljob", chosen, f"team={team}")
    named = await _run_ctl(crds, "get", "-o", "name", "-l", f"team={team}")
    bare = await _run_ctl(crds, "get", "imageprepulljob", "--no-headers", "--selector", f"team={team}")
    everything = await _run_ctl(crds, "get", "imageprepulljob", "-o", "name")
    wide = await _run_ctl(crds, "get", "imageprepulljob", "-o", "wide", "-l", f"team={team}")
    assert named.returncode == 0, named.stderr
    assert named.stdout.decode() == f"imageprepulljob.operations.kubeedge.io/{chosen}\n"
    assert bare.returncode == 0, bare.stderr
    (row,) = bare.stdout.decode().splitlines()
    assert row.split()[:2] == ["imageprepulljob", chosen]
    header, wide_row = wide.stdout.decode().splitlines()
    assert header.split()[-2:] == ["TARGET", "REASON"], header
    assert wide_row.split()[:2] == ["imageprepulljob", chosen]
    assert "1 image: a:1" in wide_row, wide_row
    listed = everything.stdout.decode().splitlines()
    assert f"imageprepulljob.operations.kubeedge.io/{other}" in listed
    assert f"imageprepulljob.operations.kubeedge.io/{chosen}" in listed


async def test_get_prints_the_api_objects_as_json_or_yaml_as_kubectl_does(crds: ControlPlane) -> None:
    """`ctl get -o json|yaml` prints a List of the jobs with every field the API server keeps, the same objects
    `kubectl get -o json` prints."""
    team = unique("team")
    names = sorted(unique("printed") for _ in range(2))
    for name in names:
        spec: dict[str, object] = {"imagePrePullTemplate": {"images": ["a:1"], "nodeNames": ["x"]}}
        await create_job(crds, "ImagePrePullJob", name, spec)
        await kubectl(crds, "label", "imageprepulljob", name, f"team={team}")
    as_json = await _run_ctl(crds, "get", "imageprepulljob", "-o", "json", "-l", f"team={team}")
    as_yaml = await _run_ctl(crds, "get", "-o", "yaml", "-l", f"team={team}")
    theirs = json.loads((await kubectl(crds, "get", "imageprepulljob", "-l", f"team={team}", "-o", "json")).stdout)
    assert as_json.returncode == 0, as_json.stderr
    ours = json.loads(as_json.stdout)
    assert (ours["apiVersion"], ours["kind"]) == ("v1", "List")
    assert [o["metadata"]["name"] for o in ours["items"]] == names
    assert ours["items"] == theirs["items"]  # uid, resourceVersion, status: nothing dropped or added
    assert "managedFields" not in ours["items"][0]["metadata"]  # as kubectl leaves them out
    managed = await _run_ctl(
        crds, "get", "imageprepulljob", "-o", "json", "-l", f"team={team}", "--show-managed-fields"
    )
    assert json.loads(managed.stdout)["items"][0]["metadata"]["managedFields"], managed.stdout
    assert as_yaml.returncode == 0, as_yaml.stderr
    assert yaml.safe_load(as_yaml.stdout)["items"] == theirs["items"]  # every kind: only these two match


async def test_kubeconfig_and_context_go_before_the_command_as_with_kubectl(crds: ControlPlane, tmp_path: Path) -> None:
    """`nodetaskd --kubeconfig K --context C ctl get` uses context C of K; K's current context (an API server
    that is not there) fails in one line with exit 3, and so does a context K does not have, naming it."""
    config = yaml.safe_load(crds.kubeconfig("admin").read_text())
    (good,) = config["contexts"]
    config["clusters"].append({"name": "gone", "cluster": {"server": "https://127.0.0.1:1"}})
    config["contexts"].append({"name": "gone", "context": {**good["context"], "cluster": "gone"}})
    config["current-context"] = "gone"
    kubeconfig = tmp_path / "two-contexts.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    name = unique("context")
    await create_job(crds, "ImagePrePullJob", name, {"imagePrePullTemplate": {"images": ["a:1"], "nodeNames": ["x"]}})
    command = [sys.executable, "-m", "roles.cli", f"--kubeconfig={kubeconfig}"]
    chosen = await anyio.run_process([*command, "--context", good["name"], "ctl", "get", "-o", "name"], check=False)
    current = await anyio.run_process([*command, "ctl", "get"], check=False)
    unknown = await anyio.run_process([*command, "ctl", "get", "--context=elsewhere"], check=False)
    assert chosen.returncode == 0, chosen.stderr
    assert f"imageprepulljob.operations.kubeedge.io/{name}" in chosen.stdout.decode().splitlines()
    for failed in (current, unknown):
        assert failed.returncode == 3, failed
        assert failed.stderr.decode().count("\n") == 1, failed.stderr
    assert b"127.0.0.1:1" in current.stderr, current.stderr
    assert b"elsewhere" in unknown.stderr, unknown.stderr
