"""The job types every role knows, by KubeEdge resource type (``nodeupgradejob`` ...).

Built by a function rather than filled at import time, so each role owns the mapping it uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from flows.diagnosis import job as diagnosis_job
from flows.nodejobs import configupdatejob, imageprepulljob, nodeupgradejob
from flows.nodejobs.jobtype import EdgeJobType, JobType


def job_types() -> Mapping[str, JobType]:
    """A read-only mapping of resource type to job type."""
    types = (nodeupgradejob.JOB_TYPE, imageprepulljob.JOB_TYPE, configupdatejob.JOB_TYPE)
    return MappingProxyType({jt.resource_type: jt for jt in types})


def edge_job_types() -> Mapping[str, EdgeJobType]:
    """What an edge agent runs: the node jobs and diagnosis Tasks (which the hubs dispatch apart)."""
    return MappingProxyType({**job_types(), diagnosis_job.RESOURCE_TYPE: diagnosis_job.JOB_TYPE})
