"""The phase vocabulary every layer shares: job phases, node-task phases and condition statuses."""

from __future__ import annotations

import enum

__all__ = ["ConditionStatus", "JobPhase", "NodeTaskPhase"]


class JobPhase(enum.StrEnum):
    """The phase of a whole node job (``status.phase``)."""

    NONE = ""
    """Not yet initialised by the controller."""
    INIT = "Init"
    IN_PROGRESS = "InProgress"
    COMPLETED = "Completed"
    FAILURE = "Failure"


class NodeTaskPhase(enum.StrEnum):
    """The phase of one node's task (``status.nodeStatus[].phase``)."""

    NONE = ""
    PENDING = "Pending"
    IN_PROGRESS = "InProgress"
    SUCCESSFUL = "Successful"
    FAILURE = "Failure"
    UNKNOWN = "Unknown"

    @property
    def terminal(self) -> bool:
        """Successful, Failure and Unknown end a node task (Unknown may still be revived by a report)."""
        return self in (NodeTaskPhase.SUCCESSFUL, NodeTaskPhase.FAILURE, NodeTaskPhase.UNKNOWN)


class ConditionStatus(enum.StrEnum):
    """``metav1.ConditionStatus`` as used by action and image results."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"
