"""The ``containers.list`` and ``images.list`` collectors: the container runtime's lists through CRI.

The CRI client (grpcio, protobuf) is never loaded into the agent: the listing runs in the image
puller's child process (:func:`roles.edge.runtime.puller.list_in_child`), as pulls do.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
import structlog

from roles.edge.processors.env import ProcessorEnv
from roles.edge.processors.outcome import MAX_VALUE_CHARS, ProcessorOutcome, failed
from roles.edge.processors.request_keys import json_list
from roles.edge.runtime.puller import ListAnswer, ListRequest, list_in_child

__all__ = ["containers_results", "images_results", "run_list"]

_SHORT_ID: Final = 13
"""Characters of an id kept in the lists (crictl's 13: enough to tell them apart, short enough for many)."""


class _Container(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    id: str
    name: str
    state: str
    image: str = ""
    pod: str = ""
    namespace: str = ""
    attempt: int = 0


class _Image(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    id: str
    tags: tuple[str, ...] = ()
    size: int = 0


def _short(identifier: str) -> str:
    return identifier.removeprefix("sha256:")[:_SHORT_ID]


def containers_results(answer: ListAnswer) -> dict[str, str]:
    """The documented keys of ``containers.list`` for a listing."""
    items = [
        _Container(
            id=_short(c.id),
            name=c.name,
            state=c.state.removeprefix("CONTAINER_").lower(),
            image=c.image,
            pod=c.pod_name,
            namespace=c.pod_namespace,
            attempt=c.attempt,
        )
        for c in sorted(answer.containers, key=lambda c: (c.pod_namespace, c.pod_name, c.name, c.id))
    ]
    text, shown = json_list(items, MAX_VALUE_CHARS)
    return {
        "containers.list.count": str(len(items)),
        "containers.list.running": str(sum(c.state == "CONTAINER_RUNNING" for c in answer.containers)),
        "containers.list.items": text,
        "containers.list.shown": str(shown),
    }


def images_results(answer: ListAnswer) -> dict[str, str]:
    """The documented keys of ``images.list`` for a listing."""
    items = [
        _Image(id=_short(i.id), tags=i.repo_tags, size=i.size)
        for i in sorted(answer.images, key=lambda i: (i.repo_tags, i.id))
    ]
    text, shown = json_list(items, MAX_VALUE_CHARS)
    return {
        "images.list.count": str(len(items)),
        "images.list.bytes": str(sum(i.size for i in answer.images)),
        "images.list.items": text,
        "images.list.shown": str(shown),
    }


async def run_list(what: Literal["images", "containers"], env: ProcessorEnv) -> ProcessorOutcome:
    """List the runtime's ``what`` at ``env.cri_endpoint``; a failure says why the runtime did not answer."""
    log = env.logger
    request = ListRequest(
        endpoint=env.cri_endpoint,
        what=what,
        log_level=env.log_level,
        log_format=env.log_format,
        log_context={k: str(v) for k, v in structlog.get_context(log).items()} if env.log is not None else {},
    )
    answer = await list_in_child(request, log=log)
    if answer.error:
        return failed(f"the container runtime at {env.cri_endpoint} did not list its {what}: {answer.error}")
    results = images_results(answer) if what == "images" else containers_results(answer)
    return ProcessorOutcome(succeeded=True, results=results)
