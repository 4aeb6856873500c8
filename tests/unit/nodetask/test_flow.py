"""Action flows are validated when defined and answer next/final exactly as KubeEdge's."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flows.nodejobs import configupdatejob, imageprepulljob, nodeupgradejob
from nodetask.flow import Flow, FlowError, Step, UnknownActionError


def test_node_upgrade_flow_edges() -> None:
    """Check -> WaitingConfirmation -> BackUp -> Upgrade, and Upgrade -fail-> RollBack, nothing else."""
    flow = nodeupgradejob.FLOW
    assert flow.first == "Check"
    assert flow.next("Check", True) == "WaitingConfirmation"
    assert flow.next("Check", False) is None
    assert flow.next("WaitingConfirmation", True) == "BackUp"
    assert flow.next("WaitingConfirmation", False) is None
    assert flow.next("BackUp", True) == "Upgrade"
    assert flow.next("BackUp", False) is None
    assert flow.next("Upgrade", True) is None
    assert flow.next("Upgrade", False) == "RollBack"
    assert flow.next("RollBack", True) is None
    assert flow.next("RollBack", False) is None


def test_image_prepull_and_config_update_flow_edges() -> None:
    """Check -> Pull; and Check -> BackUp -> Update, Update -fail-> RollBack."""
    assert imageprepulljob.FLOW.actions == ("Check", "Pull")
    assert imageprepulljob.FLOW.next("Check", True) == "Pull"
    assert imageprepulljob.FLOW.next("Check", False) is None
    assert imageprepulljob.FLOW.next("Pull", True) is None
    flow = configupdatejob.FLOW
    assert [flow.next(a, True) for a in flow.actions] == ["BackUp", "Update", None, None]
    assert [flow.next(a, False) for a in flow.actions] == [None, None, "RollBack", None]


@pytest.mark.parametrize(
    ("action", "ok", "final"),
    [
        ("Check", True, False),
        ("Check", False, True),
        ("WaitingConfirmation", True, False),
        ("BackUp", False, True),
        ("Upgrade", True, True),
        ("Upgrade", False, False),
        ("RollBack", True, True),
        ("RollBack", False, True),
    ],
)
def test_final_action_rule(action: str, ok: bool, final: bool) -> None:
    """Final iff (ok and no success edge) or (not ok and no failure edge)."""
    assert nodeupgradejob.FLOW.is_final(action, ok) is final


def test_unknown_action_raises_naming_it() -> None:
    """An unknown action name raises instead of answering an empty value."""
    with pytest.raises(UnknownActionError, match="invalid nodeupgradejob action 'Reboot'"):
        nodeupgradejob.FLOW.next("Reboot", True)
    with pytest.raises(UnknownActionError):
        nodeupgradejob.FLOW.is_final("", True)


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ({"a": Step(on_success="b")}, "which is not a step"),
        ({"a": Step(on_success="b"), "b": Step(on_failure="a")}, "cycle a -> b -> a"),
        ({"a": Step(), "b": Step()}, "unreachable from a: b"),
        ({"b": Step()}, "first action 'a' is not one of its steps"),
        ({"a": Step(on_success="a")}, "cycle a -> a"),
    ],
)
def test_invalid_flows_are_rejected_at_definition(steps: dict[str, Step], message: str) -> None:
    """Dangling targets, cycles and unreachable actions fail when the flow is defined."""
    with pytest.raises(FlowError, match=message):
        Flow(name="t", first="a", steps=steps)


def test_flow_steps_cannot_be_changed() -> None:
    """A flow's mapping is frozen, so one task cannot rewrite the flow of all."""
    with pytest.raises(TypeError):
        nodeupgradejob.FLOW.steps["Check"] = Step()  # type: ignore[index]


@st.composite
def random_graphs(draw: st.DrawFn) -> tuple[list[str], dict[str, Step]]:
    names = [f"a{i}" for i in range(draw(st.integers(1, 8)))]
    target = st.one_of(st.none(), st.sampled_from(names))
    steps = {n: Step(on_success=draw(target), on_failure=draw(target)) for n in names}
    return names, steps


def _walks_end(flow: Flow, outcomes: list[bool]) -> bool:
    action: str | None = flow.first
    for ok in outcomes:
        if action is None:
            return True
        final = flow.is_final(action, ok)
        action = flow.next(action, ok)
        assert final == (action is None)
    return True


@given(random_graphs(), st.lists(st.booleans(), max_size=20))
def test_any_accepted_flow_is_a_finite_dag(graph: tuple[list[str], dict[str, Step]], outcomes: list[bool]) -> None:
    """Every graph the constructor accepts has its actions reachable and every walk ends within its size."""
    names, steps = graph
    try:
        flow = Flow(name="g", first=names[0], steps=steps)
    except FlowError:
        return
    assert set(flow.actions) == set(names)
    action: str | None = flow.first
    for _ in range(len(names) + 1):
        if action is None:
            break
        action = flow.next(action, True)
    assert action is None
    assert _walks_end(flow, outcomes)
