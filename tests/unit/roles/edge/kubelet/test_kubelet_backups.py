"""The kubelet backups a device keeps: the one of the kubelet last replaced, and none for a job that swaps nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from flows.nodejobs import nodeupgradejob
from roles.edge.checks.checks import Thresholds
from roles.edge.context import TaskContext
from roles.edge.kubelet import upgrade
from roles.edge.store.records import NodeTask, TaskState
from roles.edge.store.store import open_store
from schemas.v1alpha2 import NodeComponent, NodeUpgradeJobSpec
from tests.unit.roles.edge.kubelet.test_kubelet_check import RUNNING, _config, _kubelet


async def _back_up(home: Path, version: str) -> set[str]:
    """BackUp of a job to ``version`` on a device whose kubelet runs :data:`RUNNING`: the backups afterwards."""
    config = _config(home, binary=str(_kubelet(home)), restartCommand=["/bin/true"], healthzUrl="http://127.0.0.1:1/")
    spec = NodeUpgradeJobSpec(version=version, node_names=("edge-1",), component=NodeComponent.KUBELET)
    task = NodeTask(
        job_uid=f"uid-{version}", route="operations.kubeedge.io/v1alpha2/nodeupgradejob/j/nodes/edge-1",
        job_type=nodeupgradejob.JOB_TYPE.resource_type, spec=b"{}", run_action_id="1", received_at=datetime.now(UTC),
        state=TaskState.RUNNING, current_action="BackUp",
    )  # fmt: skip
    async with open_store(home / "store.sqlite") as store:
        ctx = TaskContext(
            task=task, spec=spec, node="edge-1", version="v0.1.0", data_dir=home / "data", thresholds=Thresholds(),
            store=store, config_file=config,
        )  # fmt: skip
        outcome = await upgrade.back_up(ctx)
        assert outcome.succ, outcome
        await upgrade._keep_one_backup(ctx, RUNNING)
    root = home / "data" / "kubelet" / "backup"
    return {p.name for p in root.iterdir()} if root.exists() else set()


async def test_a_job_for_the_running_version_backs_nothing_up(tmp_path: Path) -> None:
    """Nothing is swapped, so the backup of the kubelet replaced before stays the only one."""
    assert await _back_up(tmp_path, RUNNING) == set()


async def test_only_the_backup_of_the_kubelet_last_replaced_is_kept(tmp_path: Path) -> None:
    """A healthy upgrade from the running version leaves its backup alone: older ones are in the registry."""
    for older in ("v1.19.0", "v1.20.1"):
        (tmp_path / "data" / "kubelet" / "backup" / older).mkdir(parents=True)
        (tmp_path / "data" / "kubelet" / "backup" / older / "kubelet").write_bytes(b"old")
    assert await _back_up(tmp_path, "v1.21.0") == {RUNNING}
    assert (tmp_path / "data" / "kubelet" / "backup" / RUNNING / "kubelet").read_bytes() == _kubelet(
        tmp_path
    ).read_bytes()
