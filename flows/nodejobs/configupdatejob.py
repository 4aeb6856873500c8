"""ConfigUpdateJob: change fields of the edge agent's own configuration.

``Check -> BackUp -> Update``, and ``Update -fail-> RollBack``. ``updateFields`` maps dotted paths of
the agent's YAML config to values typed as keadm's ``--set`` types them. As for upgrades, a completed
RollBack ends the node task as Failure (KubeEdge: Successful).
"""

from __future__ import annotations

from typing import Final

from flows.nodejobs.jobtype import JobType, rollback_is_failure
from nodetask.flow import Flow, Step
from schemas.kinds import CONFIG_UPDATE_JOB
from schemas.v1alpha2 import ConfigUpdateJobSpec

CHECK: Final = "Check"
BACK_UP: Final = "BackUp"
UPDATE: Final = "Update"
ROLL_BACK: Final = "RollBack"

FLOW: Final = Flow(
    name="configupdatejob",
    first=CHECK,
    steps={
        CHECK: Step(on_success=BACK_UP),
        BACK_UP: Step(on_success=UPDATE),
        UPDATE: Step(on_failure=ROLL_BACK),
        ROLL_BACK: Step(),
    },
)

JOB_TYPE: Final = JobType(
    kind=CONFIG_UPDATE_JOB,
    flow=FLOW,
    spec_type=ConfigUpdateJobSpec,
    verdict=rollback_is_failure(ROLL_BACK, "the config update failed and the previous config was restored"),
    exclusive=True,
)
