"""The controller's approval label follows the Node's request and its Autonomy condition, and never asks twice."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.autonomy.approval import APPROVED, DENIED, WITHDRAWN, LabelChange, approval, label_change
from nodetask.autonomy import AUTONOMY_ANNOTATION, CONDITION_TYPE, DURATION_ANNOTATION, STATUS_LABEL
from schemas.core import Node, NodeCondition, NodeStatus
from schemas.meta import ObjectMeta

BETA = st.sampled_from([None, "true", "false", "True"])
DURATION = st.sampled_from([None, "0", "0s", "-1m", "90s", "1.5s", "300ms", "1h", "bogus", "1d", ""])
CONDITION = st.none() | st.builds(
    NodeCondition,
    type=st.just(CONDITION_TYPE),
    status=st.sampled_from(["True", "False", "Unknown", ""]),
    reason=st.sampled_from(["", "autonomy enabled successfully", "cache failed", "autonomy disabled"]),
)
LABEL = st.sampled_from([None, "true", "false", "maybe", ""])


def node(
    *, beta: str | None = None, duration: str | None = None, condition: NodeCondition | None = None, label: str | None
) -> Node:
    annotations = {k: v for k, v in ((AUTONOMY_ANNOTATION, beta), (DURATION_ANNOTATION, duration)) if v is not None}
    labels = {"kubernetes.io/hostname": "edge-1"} | ({} if label is None else {STATUS_LABEL: label})
    ready = NodeCondition(type="Ready", status="True")
    conditions = (ready,) if condition is None else (ready, condition)
    meta = ObjectMeta(name="edge-1", labels=labels, annotations=annotations)
    return Node(metadata=meta, status=NodeStatus(conditions=conditions))


def labelled(before: Node, change: LabelChange) -> Node:
    """``before`` as the API server returns it after the change's merge patch."""
    labels = dict(before.metadata.labels)
    for key, value in change.patch()["metadata"]["labels"].items():
        if value is None:
            labels.pop(key, None)
        else:
            labels[key] = value
    return msgspec.structs.replace(before, metadata=msgspec.structs.replace(before.metadata, labels=labels))


@given(BETA, DURATION, CONDITION, LABEL)
def test_a_label_written_is_the_label_wanted_and_asks_for_nothing_more(
    beta: str | None, duration: str | None, condition: NodeCondition | None, label: str | None
) -> None:
    """Applying a change leaves a Node on which the decision is "nothing to do": no write loop."""
    before = node(beta=beta, duration=duration, condition=condition, label=label)
    change = label_change(before)
    if change is None:
        assert before.metadata.labels.get(STATUS_LABEL) == approval(before)
        return
    after = labelled(before, change)
    assert after.metadata.labels.get(STATUS_LABEL) == change.value == approval(before)
    assert label_change(after) is None
    assert {k: v for k, v in after.metadata.labels.items() if k != STATUS_LABEL} == {"kubernetes.io/hostname": "edge-1"}


@given(BETA, DURATION, CONDITION, LABEL)
def test_the_label_is_true_only_for_a_request_whose_condition_is_true_and_absent_without_a_request(
    beta: str | None, duration: str | None, condition: NodeCondition | None, label: str | None
) -> None:
    """Requested and True: "true"; requested otherwise (Unknown, False, empty, absent): "false"; else no label."""
    wanted = approval(node(beta=beta, duration=duration, condition=condition, label=label))
    parses = duration is not None and duration not in ("bogus", "1d", "")
    requested = beta == "true" or parses
    if not requested:
        assert wanted is None
    else:
        assert wanted == ("true" if condition is not None and condition.status == "True" else "false")


@pytest.mark.parametrize(
    ("before", "value", "reason", "warning"),
    [
        (
            node(duration="90s", condition=NodeCondition(type=CONDITION_TYPE, status="True"), label=None),
            "true",
            APPROVED,
            False,
        ),
        (node(beta="true", label=None), "false", DENIED, False),
        (
            node(
                beta="true",
                condition=NodeCondition(type=CONDITION_TYPE, status="Unknown", reason="cache failed"),
                label="true",
            ),
            "false",
            DENIED,
            True,
        ),
        (node(duration="forever", label="true"), None, WITHDRAWN, False),
        (node(label="false"), None, WITHDRAWN, False),
    ],
)
def test_each_change_has_its_event(before: Node, value: str | None, reason: str, warning: bool) -> None:
    """Approved, denied (a warning only for a failing cache) and withdrawn each carry their reason."""
    change = label_change(before)
    assert change is not None
    assert (change.value, change.reason, change.warning) == (value, reason, warning)


def test_a_withdrawal_by_an_unparsable_duration_names_the_annotation() -> None:
    """The Event of a label removed because the duration does not parse says which annotation and why."""
    change = label_change(node(duration="forever", label="true"))
    assert change is not None
    assert DURATION_ANNOTATION in change.message
    assert "'forever'" in change.message


def test_a_denial_names_the_condition_s_reason() -> None:
    """A Node whose cache fails is denied with the condition's status and reason in the message."""
    failing = NodeCondition(type=CONDITION_TYPE, status="Unknown", reason="cache failed")
    change = label_change(node(beta="true", condition=failing, label=None))
    assert change is not None
    assert change.message == "autonomy not approved: condition Autonomy is Unknown: cache failed"


def test_the_patch_names_only_the_approval_label() -> None:
    """The merge patch sets or nulls the one label, so labels others write are never touched."""
    assert LabelChange("true", APPROVED, "").patch() == {"metadata": {"labels": {STATUS_LABEL: "true"}}}
    assert LabelChange(None, WITHDRAWN, "").patch() == {"metadata": {"labels": {STATUS_LABEL: None}}}
