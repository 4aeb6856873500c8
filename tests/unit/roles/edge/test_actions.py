"""The device actions the agent has for each job type's flow."""

from __future__ import annotations

from flows.nodejobs import imageprepulljob
from roles.edge.actions import build_actions


async def _pull(*_: object) -> tuple[()]:
    return ()


def test_prepull_flow_is_what_the_agent_walks() -> None:
    """The agent's actions cover every action of the ImagePrePullJob flow."""
    actions = build_actions(pull=_pull, credentials=lambda _: ({}, ""))
    assert {a for (t, a) in actions if t == "imageprepulljob"} == set(imageprepulljob.FLOW.actions)
