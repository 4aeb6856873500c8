"""The controller's approval of autonomy: the Node label ``node.autonomy.openyurt.io/status``.

The seed's Controller section, which OpenYurt never built: a Node that asks for autonomy (either
annotation, :func:`nodetask.autonomy.autonomy_request`) is labelled ``true`` while its ``Autonomy``
condition is ``True``, and ``false`` while it is anything else (``Unknown``: its cache is failing;
``False``; or not reported yet). A Node that does not ask (no annotation, or one that does not
parse) carries no label: withdrawing the request removes it. The condition is the device's to
report (through its hub); the controller only reads it.

Pure: the decision is taken on the Node as cached, and applying it yields a Node on which the
decision is "nothing to do", so a label write never leads to another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from nodetask.autonomy import CONDITION_TYPE, STATUS_LABEL, autonomy_request
from nodetask.names import clip
from nodetask.phases import ConditionStatus
from schemas.core import Node, NodeCondition

__all__ = ["APPROVED", "DENIED", "WITHDRAWN", "LabelChange", "approval", "label_change"]

APPROVED: Final = "AutonomyApproved"
DENIED: Final = "AutonomyDenied"
WITHDRAWN: Final = "AutonomyWithdrawn"


@dataclass(frozen=True, slots=True)
class LabelChange:
    """A change of the approval label, and the Event that tells it."""

    value: str | None
    """The label's new value; None removes it."""
    reason: str
    message: str
    warning: bool = False

    def patch(self) -> dict[str, Any]:
        """The JSON merge patch that makes it (only this label; a null removes it)."""
        return {"metadata": {"labels": {STATUS_LABEL: self.value}}}


def _condition(node: Node) -> NodeCondition | None:
    return next((c for c in node.status.conditions if c.type == CONDITION_TYPE), None)


def approval(node: Node) -> str | None:
    """The label value ``node`` should carry: ``"true"``, ``"false"``, or None for no label."""
    if not autonomy_request(node.metadata.annotations).requested:
        return None
    condition = _condition(node)
    return "true" if condition is not None and condition.status == ConditionStatus.TRUE else "false"


def label_change(node: Node) -> LabelChange | None:
    """What to write on ``node``'s approval label, or None when it is already right."""
    wanted = approval(node)
    current = node.metadata.labels.get(STATUS_LABEL)
    if wanted == current:
        return None
    if wanted is None:
        request = autonomy_request(node.metadata.annotations)
        why = request.problem or "no autonomy annotation"
        return LabelChange(None, WITHDRAWN, f"autonomy is no longer requested ({why}): approval label removed")
    condition = _condition(node)
    if wanted == "true":
        return LabelChange("true", APPROVED, f"autonomy approved: condition {CONDITION_TYPE} is True")
    if condition is None:
        return LabelChange("false", DENIED, f"autonomy not approved: the node has not reported {CONDITION_TYPE} yet")
    detail = f": {clip(condition.reason, 128)}" if condition.reason else ""
    message = f"autonomy not approved: condition {CONDITION_TYPE} is {clip(condition.status, 16) or 'empty'}{detail}"
    # Unknown is a device whose cache is failing: worth a warning. False, or nothing yet, is not.
    return LabelChange("false", DENIED, message, warning=condition.status == ConditionStatus.UNKNOWN)
