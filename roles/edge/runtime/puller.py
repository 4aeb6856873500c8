"""Image pulls in a child process, so that an agent that has pulled is as small as one that has not.

grpcio and protobuf (the CRI client) are about a third of an idle agent's memory, and a Python
process cannot unload a module: an agent that pulled in-process kept them, and the channel's
threads, for the rest of its life (``docs/benchmarks.md``, edge footprint). The agent therefore runs
``python -m roles.edge.runtime.puller`` for each Pull action: it writes one :class:`PullRequest` to
the child's stdin and reads one JSON list of image statuses from its stdout. The child logs to the
agent's stderr with the agent's bound keys. Cancelling the pull kills the child, which closes its
CRI connection, and containerd cancels the pull.

Anything that goes wrong with the child itself (it cannot start, dies, answers garbage) fails
every image of the request with a reason that says so: the action never raises for it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import anyio
import msgspec
import structlog
import trio

from nodetask.phases import ConditionStatus
from nodetask.registry_auth import RegistryAuth, decode_credentials, encode_credentials
from roles.logs import configure_logging
from schemas.v1alpha2 import ImageStatus

__all__ = ["PullRequest", "pull_in_child", "request_for"]

Log = structlog.typing.FilteringBoundLogger

CHILD: Final = (sys.executable, *(("-P",) if sys.flags.safe_path else ()), "-m", "roles.edge.runtime.puller")
"""The child's command line. It inherits the environment, and ``-P`` when the agent has it: under the
launcher, the active version's code comes from ``PYTHONPATH`` alone, never from the working directory."""
KILL_GRACE: Final = 5.0
"""How long a cancelled child gets to end on SIGTERM before it is killed."""
MAX_OUTPUT: Final = 4 << 20
"""The most a child may write to stdout (its statuses are a few hundred bytes an image)."""


class PullRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """What one child pulls, and how it logs."""

    endpoint: str
    images: tuple[str, ...]
    retry_times: int
    credentials: dict[str, str] = {}
    """Image to its registry's credentials (:func:`encode_credentials`)."""
    refused: dict[str, str] = {}
    """Image to why its credentials could not be resolved: it fails without an attempt."""
    log_level: str = "info"
    log_format: str = "console"
    log_context: dict[str, str] = {}
    """The agent's bound log keys (node, job...), bound in the child too."""


_STATUSES: Final = msgspec.json.Decoder(tuple[ImageStatus, ...])


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
    credentials: dict[str, str] = {}
    refused: dict[str, str] = {}
    for image in images:
        try:
            auth = auth_for(image)
        except ValueError as exc:
            refused[image] = str(exc)
            continue
        if auth is not None:
            credentials[image] = encode_credentials(auth)
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


def _all_failed(images: tuple[str, ...], reason: str) -> tuple[ImageStatus, ...]:
    return tuple(ImageStatus(image=i, status=ConditionStatus.FALSE, reason=reason) for i in images)


async def pull_in_child(request: PullRequest, *, log: Log, command: Sequence[str] = CHILD) -> tuple[ImageStatus, ...]:
    """Run the pull of ``request`` in a child process (``command``); one status per image, in order."""
    try:
        process = await anyio.open_process(list(command), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None)
    except OSError as exc:
        log.error("image_puller_not_started", error=str(exc))
        return _all_failed(request.images, f"the image puller could not start: {exc}")
    output = bytearray()
    try:
        assert process.stdin is not None
        assert process.stdout is not None
        await process.stdin.send(msgspec.json.encode(request))
        await process.stdin.aclose()
        async for chunk in process.stdout:
            output += chunk
            if len(output) > MAX_OUTPUT:
                break
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
        return _all_failed(request.images, f"the image puller exited with status {code}")
    try:
        statuses = _STATUSES.decode(output)
    except msgspec.DecodeError as exc:
        log.error("image_puller_garbled", error=str(exc))
        return _all_failed(request.images, f"the image puller answered garbage: {exc}")
    if [s.image for s in statuses] != list(request.images):
        log.error("image_puller_garbled", error="statuses do not match the images")
        return _all_failed(request.images, "the image puller answered for other images")
    return statuses


# ------------------------------------------------------------------------------------------ the child


async def _pull(request: PullRequest, log: Log) -> tuple[ImageStatus, ...]:
    from roles.edge.runtime.cri import open_image_service, pull_images  # noqa: PLC0415 (only the child loads grpc)

    def auth_for(image: str) -> RegistryAuth | None:
        if image in request.refused:
            raise ValueError(request.refused[image])
        text = request.credentials.get(image)
        return decode_credentials(text) if text is not None else None

    async with open_image_service(request.endpoint) as service:
        return await pull_images(service, request.images, retry_times=request.retry_times, auth_for=auth_for, log=log)


def main() -> int:
    """The child: one request on stdin, its statuses on stdout; exit status 2 for a bad request."""
    try:
        request = msgspec.json.decode(sys.stdin.buffer.read(), type=PullRequest)
    except msgspec.DecodeError as exc:
        sys.stderr.write(f"roles.edge.runtime.puller: error: bad request: {exc}\n")
        return 2
    log = configure_logging(level=request.log_level, fmt=request.log_format).bind(**request.log_context)
    statuses = trio.run(_pull, request, log)
    sys.stdout.buffer.write(msgspec.json.encode(statuses))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
