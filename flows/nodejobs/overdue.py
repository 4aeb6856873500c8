"""When a job running as it should has ended at the latest: past that, it is stuck.

Each dispatched node ends within ``timeoutSeconds`` (the controller times it out), and a hub dispatches
``concurrency`` nodes at a time, so a job's nodes end within ``ceil(nodes / concurrency)`` timeouts of
its start (its creation, or its latest retry). A job still running later than that waits on something
that does not come: hubs that do not dispatch to connected edges, or a controller that does not time
nodes out. Pure; the controller's metrics count such jobs.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta

from nodetask.clock import parse_time
from nodetask.phases import JobPhase
from schemas import v1alpha2
from schemas.access import targeting

__all__ = ["latest_end", "overdue"]

_RUNNING = (JobPhase.NONE, JobPhase.INIT, JobPhase.IN_PROGRESS)


def latest_end(job: v1alpha2.NodeJob) -> datetime | None:
    """When ``job`` ends at the latest if every node runs to its timeout; None when unknown (no start time)."""
    aim = targeting(job)
    retry = job.status.retry
    start = retry.time if retry is not None and retry.time else job.metadata.creation_timestamp
    try:
        began = parse_time(start)
    except ValueError:
        return None
    nodes = max(1, len(job.status.node_status))
    waves = math.ceil(nodes / aim.concurrency) if aim.concurrency > 0 else 1
    return began + waves * timedelta(seconds=aim.effective_timeout)


def overdue(job: v1alpha2.NodeJob, now: datetime) -> bool:
    """Whether ``job`` still runs past :func:`latest_end`."""
    if job.status.phase not in _RUNNING:
        return False
    end = latest_end(job)
    return end is not None and now > end
