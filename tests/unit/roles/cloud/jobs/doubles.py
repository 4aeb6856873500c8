"""Doubles for the job room's unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from roles.kube import ApiError


class FakeStatusApi:
    """Holds one integer 'object'; ``update_status`` re-reads and re-applies ``conflicts`` extra times."""

    def __init__(self, *, conflicts: int = 0, error: ApiError | None = None) -> None:
        self.value = 0
        self.writes = 0
        self.conflicts = conflicts
        self.error = error

    async def update_status(
        self,
        _resource: Any,
        _name: str,
        mutate: Callable[[int], int | None],
        *,
        current: int | None = None,
        namespace: str = "",
    ) -> int:
        await anyio.sleep(0.01)
        # Like the API server: a batch that changes nothing is not written, so it cannot fail.
        if self.error is not None and mutate(self.value) is not None:
            raise self.error
        for _ in range(self.conflicts):
            self.value += 100  # another writer got in first; the batch is applied again to the new value
            mutate(self.value)
        self.conflicts = 0
        new = mutate(self.value)
        if new is not None:
            self.value = new
            self.writes += 1
        return self.value
