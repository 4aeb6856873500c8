"""The retry rules the webhook and the controller share (schemas.retry): when a retry is asked and allowed."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from nodetask.phases import JobPhase, NodeTaskPhase
from schemas.core import RETRY_ANNOTATION
from schemas.retry import (
    FINAL_PHASES,
    RETRIABLE_NODE_PHASES,
    changed_spec_fields,
    requested_retry,
    retry_refusal,
    spec_path,
    tunable_fields,
)
from schemas.v1alpha2 import RetryStatus

values = st.text(max_size=8)
annotation_maps = st.dictionaries(st.sampled_from([RETRY_ANNOTATION, "other", "nodetask.kubeedge.io/confirm"]), values)
handled = st.none() | st.builds(RetryStatus, handled=values)
KINDS = ("NodeUpgradeJob", "ImagePrePullJob", "ConfigUpdateJob")


@given(annotation_maps, handled)
def test_a_retry_is_asked_exactly_when_the_annotation_holds_a_value_not_yet_handled(
    found: dict[str, str], retry: RetryStatus | None
) -> None:
    """Absent asks nothing; a value asks once, until it is recorded as handled (the empty string too)."""
    asked = requested_retry(found, retry)
    value = found.get(RETRY_ANNOTATION)
    if value is None or (retry is not None and retry.handled == value):
        assert asked is None
    else:
        assert asked == value
        assert requested_retry(found, RetryStatus(handled=value)) is None


@given(st.sampled_from(JobPhase), st.lists(st.sampled_from(NodeTaskPhase), max_size=6))
def test_only_a_finished_job_with_a_failed_or_silent_node_can_be_retried(
    phase: JobPhase, nodes: list[NodeTaskPhase]
) -> None:
    """A refusal is given unless the job is Completed or Failure and some node is Failure or Unknown."""
    refusal = retry_refusal(phase, nodes)
    allowed = phase in FINAL_PHASES and any(n in RETRIABLE_NODE_PHASES for n in nodes)
    assert (refusal == "") == allowed
    if phase not in FINAL_PHASES:
        assert "only a finished job" in refusal


json_leaf = st.booleans() | st.integers(-3, 3) | st.text(max_size=3)
# No nulls: the caller drops them first (null and absent are one field).
json_values = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=3), max_leaves=6)
field_names = st.sampled_from(["concurrency", "images", "nodeNames", "version", "timeoutSeconds"])
specs = st.dictionaries(field_names, json_values, max_size=4)
prepull_specs = st.fixed_dictionaries({"imagePrePullTemplate": specs}) | specs


@given(st.sampled_from(KINDS), prepull_specs, prepull_specs)
def test_changed_spec_fields_name_exactly_the_fields_that_differ(kind: str, new: Any, old: Any) -> None:
    """No path for equal specs, the same paths both ways, and each path names a field that differs."""
    changed = changed_spec_fields(kind, new, old)
    assert changed == changed_spec_fields(kind, old, new)
    assert (changed == ()) == (new == old)
    for path in changed:
        parts = path.split(".")[1:]
        assert _at(new, parts) != _at(old, parts)


def _at(value: Any, parts: list[str]) -> Any:
    for part in parts:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def test_each_kind_tunes_only_the_fields_it_has_at_its_own_path() -> None:
    """Pre-pulls tune their template's fields; an upgrade has no retryTimes, a config update no checkItems."""
    assert tunable_fields("ImagePrePullJob") == (
        "timeoutSeconds",
        "concurrency",
        "failureTolerate",
        "checkItems",
        "retryTimes",
        "imageSecrets",
    )
    assert tunable_fields("NodeUpgradeJob") == ("timeoutSeconds", "concurrency", "failureTolerate", "checkItems")
    assert tunable_fields("ConfigUpdateJob") == ("timeoutSeconds", "concurrency", "failureTolerate")
    assert spec_path("ImagePrePullJob", "concurrency") == "spec.imagePrePullTemplate.concurrency"
    assert spec_path("ConfigUpdateJob", "concurrency") == "spec.concurrency"
