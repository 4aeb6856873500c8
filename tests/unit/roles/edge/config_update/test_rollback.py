"""An agent that cannot start with an updated configuration puts the previous one back and reports RollBack."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import msgspec
import pytest
import structlog
import trio

from nodetask.route import Route
from roles.cli.main import main
from roles.common.restart import EXIT_RESTART, SUPERVISOR_ENV, RestartRequested
from roles.edge.checks.checks import Thresholds
from roles.edge.config_update import config_update
from roles.edge.config_update import pending as config_pending
from roles.edge.context import TaskContext
from roles.edge.launcher.launcher import _load
from roles.edge.store.store import EdgeStore, open_store
from schemas.v1alpha2 import ConfigUpdateJobSpec


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures structlog for the process; later tests must not log into a closed capture."""
    yield
    structlog.reset_defaults()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EdgeStore]:
    async with open_store(tmp_path / "data" / "store.sqlite") as opened:
        yield opened


def write_config(home: Path, **options: object) -> Path:
    (home / "token").write_text("secret")
    config = {
        "nodeName": "edge-1",
        "hubUrls": ["ws://127.0.0.1:1"],
        "tokenFile": str(home / "token"),
        "dataDir": str(home / "data"),
        "criEndpoint": "",
        **options,
    }
    path = home / "edge.yaml"
    path.write_bytes(msgspec.yaml.encode(config))
    return path


async def never_connected(within: float) -> bool:
    return False


async def context(store: EdgeStore, home: Path, fields: dict[str, str]) -> TaskContext:
    spec = ConfigUpdateJobSpec(node_names=("edge-1",), update_fields=fields)
    route = Route(api_version="operations.kubeedge.io/v1alpha2", job_type="configupdatejob", job="j", node="edge-1")
    task, _ = await store.add_task(
        job_uid="uid-1",
        route=str(route),
        job_type="configupdatejob",
        spec=msgspec.json.encode(spec),
        run_action_id="r-1",
        action="Check",
    )
    return TaskContext(
        task=task,
        spec=spec,
        node="edge-1",
        version="v0.1.0",
        data_dir=home / "data",
        thresholds=Thresholds(cpu=100, mem=100, disk=100),
        store=store,
        config_file=home / "edge.yaml",
        health_deadline=1,
        wait_connected=never_connected,
    )


async def updated(store: EdgeStore, home: Path) -> tuple[TaskContext, bytes]:
    """Check, BackUp and Update run: the new file is written and a restart asked for; the previous file."""
    config = write_config(home)
    previous = config.read_bytes()
    ctx = await context(store, home, {"logLevel": "debug"})
    assert (await config_update.check(ctx)).succ
    assert (await config_update.back_up(ctx)).succ
    with pytest.raises(RestartRequested):
        await config_update.update(ctx)
    assert config.read_bytes() != previous
    assert config_pending.pending_path(config).exists()
    return ctx, previous


async def test_a_failed_start_restores_the_previous_file_once_and_update_reports_why(
    store: EdgeStore, tmp_path: Path
) -> None:
    """The backup is put back, Update fails with the start's error, and RollBack ends without another restart."""
    ctx, previous = await updated(store, tmp_path)
    config = tmp_path / "edge.yaml"
    assert config_pending.restore_after_failed_start(config, "tokenFile /x is empty")
    assert config.read_bytes() == previous
    # The previous file failing as well is not the update's doing: no second restore, no loop.
    assert not config_pending.restore_after_failed_start(config, "tokenFile /x is empty")

    outcome = await config_update.update(ctx)  # the agent restarted on the previous file
    assert not outcome.succ
    assert outcome.reason == (
        "the agent could not start with the new configuration (tokenFile /x is empty); "
        "the previous configuration was restored"
    )
    assert (await config_update.roll_back(ctx)).succ
    assert not config_pending.pending_path(config).exists()
    assert config.read_bytes() == previous


async def test_an_update_that_never_reaches_a_hub_is_restored_and_leaves_no_note(
    store: EdgeStore, tmp_path: Path
) -> None:
    """The health check's own roll-back clears the note, so a later failed start restores nothing."""
    ctx, previous = await updated(store, tmp_path)
    outcome = await config_update.update(ctx)
    assert "did not reach a hub within 1s" in outcome.reason
    assert (tmp_path / "edge.yaml").read_bytes() == previous
    assert not config_pending.restore_after_failed_start(tmp_path / "edge.yaml", "anything")


def test_without_an_update_on_probation_nothing_is_restored(tmp_path: Path) -> None:
    """A start failure with no pending update leaves the file alone."""
    config = write_config(tmp_path)
    before = config.read_bytes()
    assert not config_pending.restore_after_failed_start(config, "anything")
    assert config.read_bytes() == before


async def _updated_in_own_store(home: Path) -> bytes:
    async with open_store(home / "data" / "store.sqlite") as store:
        return (await updated(store, home))[1]


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (lambda home: (home / "token").write_text(""), "is empty"),
        (lambda home: (home / "edge.yaml").write_text("maxCpuUsage: [\n"), "is not valid YAML"),
    ],
    ids=["start-fails", "file-does-not-load"],
)
def test_the_entry_point_restores_and_restarts_an_agent_that_cannot_start_after_an_update(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    breaks: Callable[[Path], object],
    says: str,
) -> None:
    """A config error at start, while an update is on probation, restores the previous file and asks to restart."""
    previous = trio.run(_updated_in_own_store, tmp_path)  # main() runs its own event loop
    breaks(tmp_path)
    monkeypatch.setenv(SUPERVISOR_ENV, "test")  # a restart becomes an exit status instead of an exec
    with pytest.raises(SystemExit) as exited:
        main(["--role=edge", f"--config={tmp_path / 'edge.yaml'}"])
    assert exited.value.code == EXIT_RESTART
    assert (tmp_path / "edge.yaml").read_bytes() == previous
    assert says in capsys.readouterr().err
    note = msgspec.json.decode(config_pending.pending_path(tmp_path / "edge.yaml").read_bytes())
    assert says in note["failed"]


async def test_the_launcher_loads_the_previous_file_when_the_updated_one_does_not_load(
    store: EdgeStore, tmp_path: Path
) -> None:
    """A device restarted during the probation of an unloadable file starts from the previous one."""
    _, previous = await updated(store, tmp_path)
    (tmp_path / "edge.yaml").write_text("nodeName: [\n")
    assert _load(tmp_path / "edge.yaml", None).node_name == "edge-1"
    assert (tmp_path / "edge.yaml").read_bytes() == previous
