"""The kubelet settings a ConfigUpdateJob may change, and how their values are read (webhook and agent alike)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas.kubelet_fields import KUBELET_FIELDS, kubelet_field_problem, kubelet_value
from schemas.validation import validate_create


def _job(fields: dict[str, object]) -> dict[str, object]:
    return {
        "apiVersion": "operations.kubeedge.io/v1alpha2",
        "kind": "ConfigUpdateJob",
        "metadata": {"name": "c"},
        "spec": {"nodeNames": ["edge-1"], "component": "kubelet", "updateFields": fields},
    }


@pytest.mark.parametrize(
    ("key", "text", "value"),
    [
        ("maxPods", "42", 42),
        ("imageGCHighThresholdPercent", "85", 85),
        ("serializeImagePulls", "false", False),
        ("containerLogMaxSize", "10Mi", "10Mi"),
        ("containerLogMaxFiles", "5", 5),
        (
            "evictionHard",
            "memory.available<100Mi, nodefs.available<10%",
            {"memory.available": "100Mi", "nodefs.available": "10%"},
        ),
    ],
)
def test_each_allowed_field_reads_as_its_kubelet_configuration_type(key: str, text: str, value: object) -> None:
    """Integers, booleans, sizes and the eviction map in the kubelet flag's form become KubeletConfiguration values."""
    assert kubelet_value(key, text) == (value, "")
    assert validate_create(_job({key: text})) == ()


@pytest.mark.parametrize(
    ("key", "text", "problem"),
    [
        ("maxPods", "0", "maxPods must be an integer from 1 to 10000"),
        ("maxPods", "042", "maxPods must be an integer from 1 to 10000"),
        ("imageGCHighThresholdPercent", "101", "imageGCHighThresholdPercent must be an integer from 0 to 100"),
        ("serializeImagePulls", "yes", "serializeImagePulls must be true or false"),
        ("containerLogMaxSize", "10MB", "containerLogMaxSize must be a size such as 10Mi"),
        ("evictionHard", "memory.available>1Mi", "evictionHard 'memory.available>1Mi' is not SIGNAL<THRESHOLD"),
        ("evictionHard", "swap.available<1Mi", "evictionHard 'swap.available<1Mi' is not SIGNAL<THRESHOLD"),
        ("evictionHard", "memory.available<lots", "evictionHard memory.available's threshold 'lots' is not"),
        ("evictionHard", "pid.available<5%,pid.available<6%", "evictionHard pid.available is given twice"),
    ],
)
def test_a_value_not_of_its_type_is_refused_naming_the_field(key: str, text: str, problem: str) -> None:
    """The agent's reason and the webhook's message both start by naming the field and what it must be."""
    value, said = kubelet_value(key, text)
    assert value is None
    assert said.startswith(problem), said
    (error,) = validate_create(_job({key: text}))
    assert (error.path, error.message) == (f"spec.updateFields[{key!r}]", said)


@given(st.text(min_size=1, max_size=80).filter(lambda k: k not in KUBELET_FIELDS))
def test_any_other_key_is_refused_naming_the_allowed_set(key: str) -> None:
    """Who may reach the kubelet, where it listens and what it runs are never a job's to change."""
    problem = kubelet_field_problem(key)
    assert "is not a kubelet setting a ConfigUpdateJob may change: only containerLogMaxFiles," in problem
    assert "serializeImagePulls may be" in problem


def test_the_agents_own_fields_are_not_the_kubelets() -> None:
    """``component: kubelet`` checks the kubelet's allowlist, not the agent's (logLevel is the agent's)."""
    (error,) = validate_create(_job({"logLevel": "debug"}))
    assert error.path == "spec.updateFields['logLevel']"
    assert error.message.startswith("logLevel is not a kubelet setting")
