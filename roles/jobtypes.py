"""The job types every role knows, by KubeEdge resource type (``nodeupgradejob`` ...).

Built by a function rather than filled at import time, so each role owns the mapping it uses.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from flows import configupdatejob, imageprepulljob, nodeupgradejob
from flows.jobtype import JobType


def job_types() -> Mapping[str, JobType]:
    """A read-only mapping of resource type to job type."""
    types = (nodeupgradejob.JOB_TYPE, imageprepulljob.JOB_TYPE, configupdatejob.JOB_TYPE)
    return MappingProxyType({jt.resource_type: jt for jt in types})
