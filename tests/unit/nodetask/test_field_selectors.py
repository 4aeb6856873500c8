"""Field selectors: Kubernetes' syntax, escapes and messages, the core kinds' selectable fields, matching."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.field_selectors import FieldRequirement, check_fields, field_set, fields_match, parse_field_selector
from nodetask.label_selectors import SelectorError
from tests.unit.nodetask.selector_cases import ACCEPTED_FIELDS, FIELD_ERRORS

KINDS = {"pods": "Pod", "nodes": "Node", "configmaps": "ConfigMap", "secrets": "Secret"}
POD_FIELDS = ("metadata.name", "metadata.namespace", "spec.nodeName", "status.phase")
TEXTS = ("", "edge-1", "edge-2", "Running", "Pending", "a,b", "x=y", "back\\slash", "ns")


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "metadata": {"name": draw(st.sampled_from(TEXTS)), "namespace": draw(st.sampled_from(TEXTS))},
        "spec": {"nodeName": draw(st.sampled_from(TEXTS))} if draw(st.booleans()) else {},
        "status": {"phase": draw(st.sampled_from(TEXTS))},
    }


field_requirements = st.builds(
    FieldRequirement, field=st.sampled_from(POD_FIELDS), value=st.sampled_from(TEXTS), equals=st.booleans()
)


def reference(req: FieldRequirement, pod: dict[str, Any]) -> bool:
    """What a requirement selects, read straight off the Pod's JSON (a field not set is empty)."""
    section, key = req.field.split(".")
    value: str = pod.get(section, {}).get(key, "")
    return (value == req.value) == req.equals


@given(st.lists(field_requirements, max_size=4), pods())
def test_a_field_selector_selects_exactly_what_its_requirements_say(
    reqs: list[FieldRequirement], pod: dict[str, Any]
) -> None:
    """A selector of random requirements (values with commas, equals signs and backslashes included),
    written out and parsed back, selects a Pod exactly when every requirement holds for its JSON."""
    parsed = parse_field_selector(",".join(str(r) for r in reqs))
    check_fields("Pod", parsed)
    assert fields_match(parsed, field_set("Pod", pod)) == all(reference(r, pod) for r in reqs)


@given(st.lists(field_requirements, max_size=4))
def test_written_field_selectors_read_back_as_the_same_requirements(reqs: list[FieldRequirement]) -> None:
    """Escaped values survive the round trip; terms come back in sorted order, as Kubernetes sorts them."""
    assert parse_field_selector(",".join(str(r) for r in reqs)) == tuple(sorted(reqs, key=str))


@given(st.text(alphabet="a.=!,\\x", max_size=16) | st.text(max_size=16))
def test_any_text_parses_or_is_refused_with_a_selector_error(text: str) -> None:
    """Whatever a client sends, the parser returns requirements or raises SelectorError, nothing else."""
    with contextlib.suppress(SelectorError):
        parse_field_selector(text)


@pytest.mark.parametrize(("resource", "selector", "message"), FIELD_ERRORS)
def test_refusals_carry_the_api_servers_message(resource: str, selector: str, message: str) -> None:
    """Each malformed or unsupported field selector is refused with the pinned API server's message."""
    with pytest.raises(SelectorError) as refused:
        check_fields(KINDS[resource], parse_field_selector(selector))
    assert str(refused.value) == message


@pytest.mark.parametrize("resource", sorted(ACCEPTED_FIELDS))
def test_each_kind_is_selectable_by_its_fields_only(resource: str) -> None:
    """Every field the API server accepts for a kind is accepted, and a field of another kind is refused."""
    accepted = ACCEPTED_FIELDS[resource]
    check_fields(KINDS[resource], [FieldRequirement(f, "x") for f in accepted])
    for other in {f for fields in ACCEPTED_FIELDS.values() for f in fields} - set(accepted):
        with pytest.raises(SelectorError):
            check_fields(KINDS[resource], [FieldRequirement(other, "x")])


def test_the_selectable_fields_of_each_kind_come_from_its_json() -> None:
    """Field values are read as the API server reads them; a field an object lacks is empty."""
    pod = {
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"nodeName": "edge-1", "restartPolicy": "Always", "serviceAccountName": "default"},
        "status": {"phase": "Running", "podIP": "10.0.0.9", "podIPs": [{"ip": "10.0.0.9"}, {"ip": "fd00::9"}]},
    }
    assert field_set("Pod", pod) == {
        "metadata.name": "web",
        "metadata.namespace": "ns",
        "spec.nodeName": "edge-1",
        "spec.restartPolicy": "Always",
        "spec.schedulerName": "",
        "spec.serviceAccountName": "default",
        "status.phase": "Running",
        "status.podIP": "10.0.0.9",
        "status.nominatedNodeName": "",
    }
    assert field_set("Node", {"metadata": {"name": "edge-1"}, "spec": {"unschedulable": True}}) == {
        "metadata.name": "edge-1",
        "spec.unschedulable": "true",
    }
    assert field_set("Node", {"metadata": {"name": "edge-1"}})["spec.unschedulable"] == "false"
    assert field_set("Secret", {"metadata": {"name": "s", "namespace": "ns"}, "type": "Opaque"})["type"] == "Opaque"
    assert field_set("ConfigMap", {"metadata": {"name": "c", "namespace": "ns"}}) == {
        "metadata.name": "c",
        "metadata.namespace": "ns",
    }


def test_a_field_allowed_but_never_filled_reads_as_empty() -> None:
    """``status.podIPs`` is accepted but, as in the API server, never has a value to match."""
    (req,) = parse_field_selector("status.podIPs=10.0.0.9")
    check_fields("Pod", [req])
    assert not req.matches(field_set("Pod", {"status": {"podIPs": [{"ip": "10.0.0.9"}]}}))


def test_empty_terms_are_skipped() -> None:
    """Empty text, and empty terms between commas, select everything."""
    assert parse_field_selector("") == ()
    assert parse_field_selector(",,") == ()
    assert parse_field_selector("spec.nodeName==a,,status.phase!=Running") == (
        FieldRequirement("spec.nodeName", "a"),
        FieldRequirement("status.phase", "Running", equals=False),
    )
