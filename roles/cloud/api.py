"""What a hub asks of the API server, as protocols: :class:`~roles.kube.Kube` has them all.

Each part of the hub takes only the protocol it needs, so that unit tests can stand an in-memory
fake in for the API server (see ``tests/unit/roles/cloud/doubles.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import anyio
import anyio.abc
import msgspec
from anyio.streams.memory import MemoryObjectSendStream

from roles.common.events import EventSink
from roles.kube import Invalid, Resource, WatchEvent

__all__ = [
    "CacheApi",
    "CertificateApi",
    "HubApi",
    "JobApi",
    "JobStatusStore",
    "Lister",
    "NodeStore",
    "ObjectReader",
    "SecretSource",
    "TaskApi",
    "Watcher",
]

T = TypeVar("T", bound=msgspec.Struct)


class JobStatusStore(Protocol):
    """What a job's status writer needs: read a job, change its status, replace it."""

    async def update_status(
        self,
        resource: Resource[T],
        name: str,
        mutate: Callable[[T], T | None],
        *,
        current: T | None = None,
        namespace: str = "",
    ) -> T | None:
        """Apply ``mutate`` to object ``name`` (in ``namespace``) and replace its status with the result; the
        object as written.

        ``current`` is a copy to start from instead of a read; on a conflict the job is read again and
        ``mutate`` (pure) applied again. ``mutate`` returning None writes nothing, which is decided on
        a fresh read only. Errors: :class:`~roles.kube.NotFound` when the job is gone, any other
        :class:`~roles.kube.ApiError` when the write failed.
        """
        ...


class ObjectReader(Protocol):
    """Reads one object."""

    async def get(self, resource: Resource[T], name: str, *, namespace: str = "") -> T:
        """The object; :class:`~roles.kube.NotFound` when absent."""
        ...


class NodeStore(ObjectReader, Protocol):
    """What Node marks need: read a Node, merge-patch its annotations."""

    async def merge_patch(
        self,
        resource: Resource[T],
        name: str,
        patch: dict[str, Any],
        *,
        namespace: str = "",
        subresource: str = "",
        grace: float = 0.0,
    ) -> T:
        """A JSON merge patch, conditional when it holds ``metadata.resourceVersion`` (see ``Kube.merge_patch``)."""
        ...


class Watcher(Protocol):
    """Follows a resource."""

    async def watch(
        self,
        resource: Resource[Any],
        send: MemoryObjectSendStream[WatchEvent],
        *,
        label_selector: str = "",
        namespace: str = "",
        task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Deliver the snapshot, then the changes, to ``send`` until cancelled; ready after the snapshot."""
        ...


class Lister(Protocol):
    """Lists a resource."""

    async def list(
        self,
        resource: Resource[T],
        *,
        label_selector: str = "",
        namespace: str = "",
        field_selector: str = "",
        resource_version: str = "",
    ) -> tuple[list[T], list[Invalid], str]:
        """The objects, those that do not decode, and the list's resourceVersion (see ``Kube.list``)."""
        ...


class CertificateApi(ObjectReader, EventSink, Protocol):
    """What node certificates need: create a CertificateSigningRequest, read it again."""


class CacheApi(Lister, Watcher, Protocol):
    """What the cache streams need: watch each cached kind, list one node's or one object's."""


class SecretSource(ObjectReader, Watcher, Protocol):
    """What the token book needs: watch the labelled token Secrets, read one by name."""


class JobApi(JobStatusStore, Watcher, EventSink, Protocol):
    """What the hub's jobs need: watch jobs, write their status, record Events on them."""


class TaskApi(JobStatusStore, Watcher, ObjectReader, Lister, Protocol):
    """What the hub's diagnosis Tasks need: watch Tasks and Operations, read one, list by name, write status."""


class HubApi(JobApi, NodeStore, SecretSource, CacheApi, CertificateApi, Protocol):
    """Everything a hub asks of the API server."""
