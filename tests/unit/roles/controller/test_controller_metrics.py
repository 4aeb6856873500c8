"""The controller's metrics, as a Prometheus scrape of its registry sees them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from nodetask.phases import JobPhase, NodeTaskPhase
from roles.controller.metrics import ControllerMetrics
from schemas import v1alpha2
from schemas.kinds import IMAGE_PRE_PULL_JOB, NODE_UPGRADE_JOB
from schemas.meta import ObjectMeta
from tests.metric_samples import Samples, samples


@dataclass
class Counts:
    conflicts: int = 0
    writes: int = 0


@dataclass
class Leading:
    is_leader: bool = False


@dataclass
class Cache:
    jobs: Mapping[tuple[str, str], Any] = field(default_factory=dict)


def upgrade(name: str, phase: JobPhase, *nodes: NodeTaskPhase) -> v1alpha2.NodeUpgradeJob:
    entries = tuple(v1alpha2.NodeUpgradeJobNodeTaskStatus(node_name=f"n{i}", phase=p) for i, p in enumerate(nodes))
    return v1alpha2.NodeUpgradeJob(
        metadata=ObjectMeta(name=name), status=v1alpha2.NodeUpgradeJobStatus(phase=phase, node_status=entries)
    )


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample of a text-format scrape, by name and sorted labels."""
    return samples(generate_latest(registry).decode())


def test_jobs_and_node_tasks_are_counted_by_kind_and_phase() -> None:
    """The leader's cached jobs give job counts per kind and phase and node-task counts per node phase."""
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, kube=Counts(), leader=Leading(is_leader=True))
    cache = Cache(
        {
            ("nodeupgradejobs", "a"): upgrade("a", JobPhase.IN_PROGRESS, NodeTaskPhase.SUCCESSFUL, NodeTaskPhase.NONE),
            ("nodeupgradejobs", "b"): upgrade("b", JobPhase.IN_PROGRESS, NodeTaskPhase.UNKNOWN),
            ("nodeupgradejobs", "c"): upgrade("c", JobPhase.NONE),
            ("imageprepulljobs", "d"): v1alpha2.ImagePrePullJob(
                status=v1alpha2.ImagePrePullJobStatus(
                    phase=JobPhase.COMPLETED,
                    node_status=(v1alpha2.ImagePrePullNodeTaskStatus(node_name="x", phase=NodeTaskPhase.SUCCESSFUL),),
                )
            ),
        }
    )
    with metrics.tracking(cache):
        samples = scrape(registry)
    jobs = "nodetaskd_controller_jobs"
    tasks = "nodetaskd_controller_node_tasks"
    assert samples[jobs, (("kind", "NodeUpgradeJob"), ("phase", "InProgress"))] == 2
    assert samples[jobs, (("kind", "NodeUpgradeJob"), ("phase", "New"))] == 1
    assert samples[jobs, (("kind", "NodeUpgradeJob"), ("phase", "Completed"))] == 0
    assert samples[jobs, (("kind", "ImagePrePullJob"), ("phase", "Completed"))] == 1
    assert samples[jobs, (("kind", "ConfigUpdateJob"), ("phase", "Failure"))] == 0
    assert samples[tasks, (("kind", "NodeUpgradeJob"), ("phase", "Successful"))] == 1
    assert samples[tasks, (("kind", "NodeUpgradeJob"), ("phase", "Pending"))] == 1  # an unset phase is Pending
    assert samples[tasks, (("kind", "NodeUpgradeJob"), ("phase", "Unknown"))] == 1
    assert samples[tasks, (("kind", "ImagePrePullJob"), ("phase", "Successful"))] == 1
    assert sum(v for (name, _), v in samples.items() if name == jobs) == 4


def test_a_follower_reports_no_jobs_and_leader_zero() -> None:
    """Outside a leading term there is no cache: no job series, and the leader gauge is 0."""
    registry = CollectorRegistry()
    leading = Leading()
    metrics = ControllerMetrics(registry, kube=Counts(), leader=leading)
    samples = scrape(registry)
    assert not [k for k in samples if k[0] in ("nodetaskd_controller_jobs", "nodetaskd_controller_node_tasks")]
    assert samples["nodetaskd_controller_leader", ()] == 0
    leading.is_leader = True
    with metrics.tracking(Cache()):
        assert scrape(registry)["nodetaskd_controller_leader", ()] == 1
    assert registry.get_sample_value("nodetaskd_controller_jobs", {"kind": "NodeUpgradeJob", "phase": "New"}) is None


def test_api_writes_and_conflicts_are_read_from_the_client_at_scrape_time() -> None:
    """The write and conflict counters show the client's counts as they are when scraped."""
    registry = CollectorRegistry()
    counts = Counts(conflicts=2, writes=7)
    ControllerMetrics(registry, kube=counts, leader=Leading())
    assert registry.get_sample_value("nodetaskd_controller_status_conflicts_total") == 2
    counts.conflicts, counts.writes = 5, 11
    assert registry.get_sample_value("nodetaskd_controller_status_conflicts_total") == 5
    assert registry.get_sample_value("nodetaskd_controller_api_writes_total") == 11


def test_reconcile_latency_is_a_histogram_per_kind() -> None:
    """Each reconcile pass reported through the hook lands in the latency histogram of its kind."""
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, kube=Counts(), leader=Leading())
    for seconds in (0.003, 0.02, 0.2):
        metrics.observe_reconcile(NODE_UPGRADE_JOB, seconds)
    metrics.observe_reconcile(IMAGE_PRE_PULL_JOB, 1.5)
    name = "nodetaskd_controller_reconcile_duration_seconds"
    assert registry.get_sample_value(f"{name}_count", {"kind": "NodeUpgradeJob"}) == 3
    assert registry.get_sample_value(f"{name}_sum", {"kind": "NodeUpgradeJob"}) == pytest.approx(0.223)
    assert registry.get_sample_value(f"{name}_bucket", {"kind": "NodeUpgradeJob", "le": "0.025"}) == 2
    assert registry.get_sample_value(f"{name}_bucket", {"kind": "ImagePrePullJob", "le": "1.0"}) == 0


def test_registering_twice_in_one_registry_is_refused() -> None:
    """The collector describes its families, so a second registration into the same registry fails."""
    registry = CollectorRegistry()
    ControllerMetrics(registry, kube=Counts(), leader=Leading())
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        ControllerMetrics(registry, kube=Counts(), leader=Leading())


def test_jobs_running_past_their_timeouts_are_counted_as_overdue_per_kind() -> None:
    """At scrape time, a job still InProgress past the end its nodes' timeouts allow counts; a young one does not."""
    created = "2026-11-29T12:00:00Z"
    now = datetime(2026, 11, 29, 14, 0, tzinfo=UTC)

    def job(name: str, timeout: int) -> v1alpha2.NodeUpgradeJob:
        entries = (v1alpha2.NodeUpgradeJobNodeTaskStatus(node_name="n0", phase=NodeTaskPhase.IN_PROGRESS),)
        return v1alpha2.NodeUpgradeJob(
            metadata=ObjectMeta(name=name, creation_timestamp=created),
            spec=v1alpha2.NodeUpgradeJobSpec(version="v1.2.3", timeout_seconds=timeout),
            status=v1alpha2.NodeUpgradeJobStatus(phase=JobPhase.IN_PROGRESS, node_status=entries),
        )

    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry, kube=Counts(), leader=Leading(is_leader=True), now=lambda: now)
    cache = Cache({("nodeupgradejobs", "stuck"): job("stuck", 600), ("nodeupgradejobs", "young"): job("young", 9000)})
    with metrics.tracking(cache):
        samples = scrape(registry)
    assert samples["nodetaskd_controller_jobs_overdue", (("kind", "NodeUpgradeJob"),)] == 1
    assert samples["nodetaskd_controller_jobs_overdue", (("kind", "ImagePrePullJob"),)] == 0
