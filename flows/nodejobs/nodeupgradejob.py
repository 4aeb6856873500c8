"""NodeUpgradeJob: upgrade the edge agent itself.

``Check -> WaitingConfirmation -> BackUp -> Upgrade``, and ``Upgrade -fail-> RollBack``.
WaitingConfirmation pauses the task when ``requireConfirmation`` is set; a confirmation (from the
device or the cloud) resumes it at BackUp.

Deliberate difference from KubeEdge: a successful RollBack ends the node task as ``Failure`` with a
reason saying it was rolled back. KubeEdge counts it as Successful, which hides a failed upgrade
inside a Completed job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from flows.nodejobs.jobtype import ExtendError, JobType, rollback_is_failure
from nodetask.flow import Flow, Step
from schemas.kinds import NODE_UPGRADE_JOB
from schemas.v1alpha2 import NodeUpgradeJobSpec

CHECK: Final = "Check"
WAITING_CONFIRMATION: Final = "WaitingConfirmation"
BACK_UP: Final = "BackUp"
UPGRADE: Final = "Upgrade"
ROLL_BACK: Final = "RollBack"

FLOW: Final = Flow(
    name="nodeupgradejob",
    first=CHECK,
    steps={
        CHECK: Step(on_success=WAITING_CONFIRMATION),
        WAITING_CONFIRMATION: Step(on_success=BACK_UP),
        BACK_UP: Step(on_success=UPGRADE),
        UPGRADE: Step(on_failure=ROLL_BACK),
        ROLL_BACK: Step(),
    },
)


def read_extend(extend: str) -> Mapping[str, str]:
    """``"from,to"`` becomes historicVersion and currentVersion (either may be empty, as BackUp's)."""
    parts = extend.split(",")
    if len(parts) != 2:
        raise ExtendError(f"upgrade extend {extend!r} is not of the form 'fromVersion,toVersion'")
    historic, current = (p.strip() for p in parts)
    updates = {}
    if historic:
        updates["historic_version"] = historic
    if current:
        updates["current_version"] = current
    return updates


JOB_TYPE: Final = JobType(
    kind=NODE_UPGRADE_JOB,
    flow=FLOW,
    spec_type=NodeUpgradeJobSpec,
    verdict=rollback_is_failure(ROLL_BACK, "the upgrade failed and the node was rolled back"),
    read_extend=read_extend,
    exclusive=True,
    confirmation=WAITING_CONFIRMATION,
    asks_confirmation=lambda spec: bool(spec.require_confirmation),
)
