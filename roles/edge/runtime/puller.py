"""Image pulls, and the runtime's image and container lists, in a child process, so that an agent that
has used the CRI is as small as one that has not.

grpcio and protobuf (the CRI client) are about a third of an idle agent's memory, and a Python
process cannot unload a module: an agent that pulled in-process kept them, and the channel's
threads, for the rest of its life (``docs/benchmarks.md``, edge footprint). The agent therefore runs
``python -m roles.edge.runtime.puller`` for each Pull action and each listing (the diagnosis
collectors ``images.list`` and ``containers.list``): it writes one request (:class:`PullRequest`
or :class:`ListRequest`) to the child's stdin and reads one JSON answer from its stdout. The child
logs to the agent's stderr with the agent's bound keys. Cancelling the call kills the child, which
closes its CRI connection, and containerd cancels the pull.

Anything that goes wrong with the child itself (it cannot start, dies, answers garbage) fails
every image of a pull, or the listing, with a reason that says so: neither call raises for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Final, Literal

import anyio
import msgspec
import structlog
import trio

import roles
from nodetask.phases import ConditionStatus
from nodetask.registry_credentials import RegistryAuth
from roles.common.logs import configure_logging
from schemas.v1alpha2 import ImageStatus

__all__ = [
    "ListAnswer",
    "ListRequest",
    "ListedContainer",
    "ListedImage",
    "PullRequest",
    "list_in_child",
    "pull_in_child",
    "request_for",
]

Log = structlog.typing.FilteringBoundLogger

CHILD: Final = (sys.executable, "-P", "-m", "roles.edge.runtime.puller")
"""The child's command line; it runs the agent's own code (:func:`_child_environment`)."""
KILL_GRACE: Final = 5.0
"""How long a cancelled child gets to end on SIGTERM before it is killed."""
MAX_OUTPUT: Final = 4 << 20
"""The most a child may write to stdout (its statuses are a few hundred bytes an image)."""


class PullRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag="pull"):
    """What one child pulls, and how it logs."""

    endpoint: str
    images: tuple[str, ...]
    retry_times: int
    credentials: dict[str, RegistryAuth] = {}
    """Image to its registry's credentials."""
    refused: dict[str, str] = {}
    """Image to why its credentials could not be resolved: it fails without an attempt."""
    log_level: str = "info"
    log_format: str = "console"
    log_context: dict[str, str] = {}
    """The agent's bound log keys (node, job...), bound in the child too."""


class ListRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag="list"):
    """What one child lists (``images`` or ``containers``), and how it logs."""

    endpoint: str
    what: Literal["images", "containers"]
    log_level: str = "info"
    log_format: str = "console"
    log_context: dict[str, str] = {}


class ListedImage(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """An image the runtime has (CRI ``Image``)."""

    id: str
    repo_tags: tuple[str, ...] = ()
    repo_digests: tuple[str, ...] = ()
    size: int = 0


class ListedContainer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A container the runtime has (CRI ``Container``); the pod's name and namespace are its labels'."""

    id: str
    name: str
    state: str
    image: str = ""
    image_ref: str = ""
    attempt: int = 0
    pod_sandbox_id: str = ""
    pod_name: str = ""
    pod_namespace: str = ""
    created_at_ns: int = 0


class ListAnswer(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A listing, or why there is none (``error``, e.g. the runtime's gRPC status)."""

    images: tuple[ListedImage, ...] = ()
    containers: tuple[ListedContainer, ...] = ()
    error: str = ""


_STATUSES: Final = msgspec.json.Decoder(tuple[ImageStatus, ...])
_ANSWER: Final = msgspec.json.Decoder(ListAnswer)
_REQUEST: Final = msgspec.json.Decoder(PullRequest | ListRequest)


def request_for(
    endpoint: str,
    images: tuple[str, ...],
    retry_times: int,
    auth_for: Callable[[str], RegistryAuth | None],
    *,
    log_level: str,
    log_format: str,
    log_context: Mapping[str, object],
) -> PullRequest:
    """The request for ``images``, asking ``auth_for`` (image -> RegistryAuth | None) once per image here."""
    credentials: dict[str, RegistryAuth] = {}
    refused: dict[str, str] = {}
    for image in images:
        try:
            auth = auth_for(image)
        except ValueError as exc:
            refused[image] = str(exc)
            continue
        if auth is not None:
            credentials[image] = auth
    return PullRequest(
        endpoint=endpoint,
        images=images,
        retry_times=retry_times,
        credentials=credentials,
        refused=refused,
        log_level=log_level,
        log_format=log_format,
        log_context={k: str(v) for k, v in log_context.items()},
    )


def _child_environment() -> dict[str, str]:
    """The agent's environment, with the directory its own code was loaded from first on ``PYTHONPATH``.

    Under the launcher, ``PYTHONPATH`` names the ``current`` link, which an upgrade switches before
    the agent restarts: resolved here, the child runs the agent's version, not the next one. With
    ``-P`` the working directory is never on the child's path.
    """
    code_root = str(Path(roles.__file__).resolve().parent.parent)
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([code_root, *inherited])}


def _all_failed(images: tuple[str, ...], reason: str) -> tuple[ImageStatus, ...]:
    return tuple(ImageStatus(image=i, status=ConditionStatus.FALSE, reason=reason) for i in images)


class _ChildFailed(Exception):
    """The child could not start, died, or answered too much: the message says which."""


async def _exchange(request: bytes, *, log: Log, command: Sequence[str]) -> bytes:
    """Run the child on ``request``; its whole stdout. Errors: :class:`_ChildFailed`."""
    try:
        process = await anyio.open_process(
            list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, env=_child_environment()
        )
    except OSError as exc:
        log.error("image_puller_not_started", error=str(exc))
        raise _ChildFailed(f"the image puller could not start: {exc}") from None
    output = bytearray()
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        try:
            await process.stdin.send(request)
            await process.stdin.aclose()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the child ended before it read its request; its exit status says how
        async for chunk in process.stdout:
            output += chunk
            if len(output) > MAX_OUTPUT:
                log.error("image_puller_garbled", error="more output than any answer")
                raise _ChildFailed("the image puller answered too much")
        code = await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                process.terminate()
                with anyio.move_on_after(KILL_GRACE):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.aclose()
    if code != 0:
        log.error("image_puller_failed", exit_status=code)
        raise _ChildFailed(f"the image puller exited with status {code}")
    return bytes(output)


async def pull_in_child(request: PullRequest, *, log: Log, command: Sequence[str] = CHILD) -> tuple[ImageStatus, ...]:
    """Run the pull of ``request`` in a child process (``command``); one status per image, in order."""
    try:
        output = await _exchange(msgspec.json.encode(request), log=log, command=command)
    except _ChildFailed as exc:
        return _all_failed(request.images, str(exc))
    try:
        statuses = _STATUSES.decode(output)
    except msgspec.DecodeError as exc:
        log.error("image_puller_garbled", error=str(exc))
        return _all_failed(request.images, f"the image puller answered garbage: {exc}")
    if [s.image for s in statuses] != list(request.images):
        log.error("image_puller_garbled", error="statuses do not match the images")
        return _all_failed(request.images, "the image puller answered for other images")
    return statuses


async def list_in_child(request: ListRequest, *, log: Log, command: Sequence[str] = CHILD) -> ListAnswer:
    """The runtime's images or containers (``request.what``), listed by a child process (``command``).

    Errors: none; an answer with ``error`` says why there is no listing.
    """
    try:
        output = await _exchange(msgspec.json.encode(request), log=log, command=command)
    except _ChildFailed as exc:
        return ListAnswer(error=str(exc))
    try:
        return _ANSWER.decode(output)
    except msgspec.DecodeError as exc:
        log.error("image_puller_garbled", error=str(exc))
        return ListAnswer(error=f"the image puller answered garbage: {exc}")


# ------------------------------------------------------------------------------------------ the child


async def _pull(request: PullRequest, log: Log) -> tuple[ImageStatus, ...]:
    from roles.edge.runtime.cri import open_image_service, pull_images  # noqa: PLC0415 (only the child loads grpc)

    def auth_for(image: str) -> RegistryAuth | None:
        if image in request.refused:
            raise ValueError(request.refused[image])
        return request.credentials.get(image)

    async with open_image_service(request.endpoint) as service:
        return await pull_images(service, request.images, retry_times=request.retry_times, auth_for=auth_for, log=log)


async def _list(request: ListRequest) -> ListAnswer:
    from roles.edge.runtime import cri  # noqa: PLC0415 (only the child loads grpc)

    try:
        if request.what == "images":
            async with cri.open_image_service(request.endpoint) as images:
                found = await images.list_images()
            return ListAnswer(
                images=tuple(
                    ListedImage(id=i.id, repo_tags=i.repo_tags, repo_digests=i.repo_digests, size=i.size) for i in found
                )
            )
        async with cri.open_runtime_service(request.endpoint) as runtime:
            containers = await runtime.list_containers()
    except cri.CriError as exc:
        return ListAnswer(error=f"{exc.method}: {exc.code}: {exc.details}")
    return ListAnswer(
        containers=tuple(
            ListedContainer(
                id=c.id,
                name=c.name,
                state=c.state,
                image=c.image,
                image_ref=c.image_ref,
                attempt=c.attempt,
                pod_sandbox_id=c.pod_sandbox_id,
                pod_name=c.labels.get("io.kubernetes.pod.name", ""),
                pod_namespace=c.labels.get("io.kubernetes.pod.namespace", ""),
                created_at_ns=c.created_at_ns,
            )
            for c in containers
        )
    )


def main() -> int:
    """The child: one request on stdin, its answer on stdout; exit status 2 for a bad request."""
    try:
        request = _REQUEST.decode(sys.stdin.buffer.read())
    except msgspec.DecodeError as exc:
        sys.stderr.write(f"roles.edge.runtime.puller: error: bad request: {exc}\n")
        return 2
    log = configure_logging(level=request.log_level, fmt=request.log_format).bind(**request.log_context)
    answer: object = trio.run(_list, request) if isinstance(request, ListRequest) else trio.run(_pull, request, log)
    sys.stdout.buffer.write(msgspec.json.encode(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
