"""Events (roles.common.events): one already there counts as recorded, a refused one is logged and not raised."""

from __future__ import annotations

from typing import Any

import pytest
import structlog

from roles.common.events import object_event, record_event
from roles.kube import ApiError, Conflict
from schemas.core import Event
from schemas.meta import ObjectMeta


class Sink:
    """Creates Events, or refuses them with ``refusal``."""

    def __init__(self, refusal: ApiError | None = None) -> None:
        self.refusal = refusal
        self.created: list[Event] = []

    async def create(self, resource: Any, obj: Any, *, namespace: str = "") -> Any:
        if self.refusal is not None:
            raise self.refusal
        self.created.append(obj)
        return obj


def _event() -> Event:
    return object_event(
        api_version="v1",
        kind="Node",
        meta=ObjectMeta(name="n1"),
        reason="R",
        message="m",
        type_="Normal",
        component="c",
        now="2026-11-25T10:00:00Z",
    )


@pytest.mark.parametrize(
    ("refusal", "recorded"),
    [
        (None, True),
        (Conflict(409, "AlreadyExists", "exists"), True),
        (ApiError(403, "Forbidden", "no"), False),
    ],
    ids=["created", "already-there", "refused"],
)
async def test_an_event_already_there_counts_as_recorded_and_a_refused_one_does_not(
    refusal: ApiError | None, recorded: bool
) -> None:
    """A 409 means an earlier create of the same name landed: recorded. Any other refusal is logged, not raised."""
    with structlog.testing.capture_logs() as logs:
        assert await record_event(Sink(refusal), _event(), structlog.get_logger()) is recorded
    assert [entry["event"] for entry in logs if entry["log_level"] == "warning"] == (
        [] if recorded else ["event_not_recorded"]
    )
