"""Doubles for the tasks room's unit tests."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import msgspec

from roles.kube import ApiError, Resource
from tests.unit.roles.cloud.doubles import MemoryApi

T = TypeVar("T", bound=msgspec.Struct)


class RefusesLargeResults(MemoryApi):
    """Answers a status write holding results over ``limit`` bytes as etcd does: request too large."""

    limit = 100

    async def update_status(
        self,
        resource: Resource[T],
        name: str,
        mutate: Callable[[T], T | None],
        *,
        current: T | None = None,
        namespace: str = "",
    ) -> T | None:
        def checked(obj: T) -> T | None:
            new: Any = mutate(obj)
            if new is not None and len(msgspec.json.encode(new.status.results)) > self.limit:
                raise ApiError(500, "InternalError", "etcdserver: request is too large")
            return new  # type: ignore[no-any-return]

        return await super().update_status(resource, name, checked, current=current, namespace=namespace)
