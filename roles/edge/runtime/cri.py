"""Pull and list images through the CRI ``runtime.v1.ImageService`` of the node's container runtime, and
list its containers through the ``RuntimeService``.

Why synchronous gRPC in threads: grpcio's asyncio API needs an asyncio loop, and the edge role runs
on trio (the only trio/asyncio bridge, trio-asyncio, is confined to ``roles/kube``). So each call
starts with the synchronous stub's non-blocking ``.future()``, and a worker thread waits for the
result (``anyio.to_thread.run_sync(..., abandon_on_cancel=True)``). A cancelled caller never waits
for that thread: the RPC itself is cancelled (containerd then aborts the pull, since the server
side sees the client go away) and the thread, woken by the cancelled future, ends at once. Every
call also carries a gRPC deadline, so no thread can outlive its call's budget whatever happens.

``pull_images`` is the ImagePrePullJob ``Pull`` action's loop (KubeEdge's ``imageprepulljob.go``):
each image is tried ``retryTimes + 1`` times, 500 ms apart, and gets its own True/False status
with a reason. Unlike KubeEdge, an image that succeeded is not pulled again because another one
failed, and each image gets the credentials of its own registry (see ``registry_auth``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Final, Protocol, TypeVar, cast, final

import anyio
import anyio.to_thread
import grpc
import structlog

from roles.common.registry_auth import RegistryAuth
from roles.edge.runtime.cri_pb import api_pb2 as api
from schemas.meta import ConditionStatus
from schemas.v1alpha2 import ImageStatus

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_PULL_TIMEOUT",
    "PULL_FAILED_REASON",
    "PULL_RETRY_DELAY",
    "ContainerInfo",
    "CriError",
    "ImageInfo",
    "ImagePuller",
    "ImageService",
    "RuntimeService",
    "open_image_service",
    "open_runtime_service",
    "pull_images",
]

PULL_FAILED_REASON: Final = "there were some failures when pulling images"
"""The ``Pull`` action's reason when any image failed (KubeEdge's text)."""

PULL_RETRY_DELAY: Final = 0.5
"""Seconds between two attempts at one image (KubeEdge's fixed delay)."""

DEFAULT_CALL_TIMEOUT: Final = 10.0
"""gRPC deadline, in seconds, of the quick calls (status, list, remove)."""

DEFAULT_PULL_TIMEOUT: Final = 600.0
"""gRPC deadline, in seconds, of one ``PullImage``: large images on slow edge links take minutes."""

_MAX_MESSAGE = 16 * 1024 * 1024
"""The kubelet's CRI message size limit; gRPC's 4 MiB default is too small for a big ``ListImages``."""

_SERVICE = "/runtime.v1.ImageService/"
_RUNTIME_SERVICE = "/runtime.v1.RuntimeService/"

_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


class CriError(Exception):
    """A CRI call that failed: which call, for which image, and the runtime's gRPC status."""

    def __init__(self, *, method: str, image: str, code: str, details: str) -> None:
        super().__init__(f"{method} {image}: {code}: {details}")
        self.method = method
        self.image = image
        self.code = code
        """The gRPC status code's name, e.g. ``NOT_FOUND`` or ``UNAVAILABLE``."""
        self.details = details


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """An image the runtime has (CRI ``Image``)."""

    id: str
    repo_tags: tuple[str, ...]
    repo_digests: tuple[str, ...]
    size: int


@dataclass(frozen=True, slots=True)
class ContainerInfo:
    """A container the runtime has (CRI ``Container``)."""

    id: str
    name: str
    attempt: int
    pod_sandbox_id: str
    image: str
    image_ref: str
    state: str
    """``CONTAINER_CREATED``, ``CONTAINER_RUNNING``, ``CONTAINER_EXITED`` or ``CONTAINER_UNKNOWN``."""
    created_at_ns: int
    labels: dict[str, str]


class ImagePuller(Protocol):
    """What :func:`pull_images` needs of an image service (a seam for fakes)."""

    async def pull(self, image: str, auth: RegistryAuth | None = None) -> str:
        """Pull ``image``; return the runtime's reference to it. Errors: :class:`CriError`."""
        ...


@final
class ImageService:
    """The CRI image service of one runtime endpoint. Make it with :func:`open_image_service`."""

    def __init__(self, channel: grpc.Channel, *, endpoint: str, call_timeout: float, pull_timeout: float) -> None:
        self.endpoint = endpoint
        self._call_timeout = call_timeout
        self._pull_timeout = pull_timeout
        self._pull: grpc.UnaryUnaryMultiCallable[api.PullImageRequest, api.PullImageResponse] = channel.unary_unary(
            _SERVICE + "PullImage",
            request_serializer=api.PullImageRequest.SerializeToString,
            response_deserializer=api.PullImageResponse.FromString,
        )
        self._status: grpc.UnaryUnaryMultiCallable[api.ImageStatusRequest, api.ImageStatusResponse] = (
            channel.unary_unary(
                _SERVICE + "ImageStatus",
                request_serializer=api.ImageStatusRequest.SerializeToString,
                response_deserializer=api.ImageStatusResponse.FromString,
            )
        )
        self._list: grpc.UnaryUnaryMultiCallable[api.ListImagesRequest, api.ListImagesResponse] = channel.unary_unary(
            _SERVICE + "ListImages",
            request_serializer=api.ListImagesRequest.SerializeToString,
            response_deserializer=api.ListImagesResponse.FromString,
        )
        self._remove: grpc.UnaryUnaryMultiCallable[api.RemoveImageRequest, api.RemoveImageResponse] = (
            channel.unary_unary(
                _SERVICE + "RemoveImage",
                request_serializer=api.RemoveImageRequest.SerializeToString,
                response_deserializer=api.RemoveImageResponse.FromString,
            )
        )

    async def pull(self, image: str, auth: RegistryAuth | None = None) -> str:
        """Pull ``image`` with ``auth`` (anonymously if None); return the runtime's image reference.

        Errors: :class:`CriError` (e.g. ``NOT_FOUND``, ``UNKNOWN`` with a 401 in the details,
        ``UNAVAILABLE`` if the runtime is not listening, ``DEADLINE_EXCEEDED``).
        Cancellation: cancels the pull in the runtime and returns at once.
        """
        request = api.PullImageRequest(image=api.ImageSpec(image=image), auth=_auth_config(auth))
        response = await _call(self._pull, request, method="PullImage", image=image, deadline=self._pull_timeout)
        return response.image_ref

    async def status(self, image: str) -> ImageInfo | None:
        """The runtime's record of ``image``, or None if it does not have it. Errors: :class:`CriError`."""
        request = api.ImageStatusRequest(image=api.ImageSpec(image=image))
        response = await _call(self._status, request, method="ImageStatus", image=image, deadline=self._call_timeout)
        return _image_info(response.image) if response.HasField("image") else None

    async def list_images(self) -> tuple[ImageInfo, ...]:
        """Every image the runtime has. Errors: :class:`CriError`."""
        response = await _call(
            self._list, api.ListImagesRequest(), method="ListImages", image="*", deadline=self._call_timeout
        )
        return tuple(_image_info(image) for image in response.images)

    async def remove(self, image: str) -> None:
        """Remove ``image`` (idempotent: an absent image is not an error). Errors: :class:`CriError`."""
        request = api.RemoveImageRequest(image=api.ImageSpec(image=image))
        await _call(self._remove, request, method="RemoveImage", image=image, deadline=self._call_timeout)


@final
class RuntimeService:
    """The CRI runtime service of one runtime endpoint (listing only). Make it with :func:`open_runtime_service`."""

    def __init__(self, channel: grpc.Channel, *, endpoint: str, call_timeout: float) -> None:
        self.endpoint = endpoint
        self._call_timeout = call_timeout
        self._list: grpc.UnaryUnaryMultiCallable[api.ListContainersRequest, api.ListContainersResponse] = (
            channel.unary_unary(
                _RUNTIME_SERVICE + "ListContainers",
                request_serializer=api.ListContainersRequest.SerializeToString,
                response_deserializer=api.ListContainersResponse.FromString,
            )
        )

    async def list_containers(self) -> tuple[ContainerInfo, ...]:
        """Every container the runtime has, whatever its state. Errors: :class:`CriError`."""
        response = await _call(
            self._list, api.ListContainersRequest(), method="ListContainers", image="*", deadline=self._call_timeout
        )
        return tuple(_container_info(c) for c in response.containers)


@asynccontextmanager
async def _channel(endpoint: str) -> AsyncIterator[grpc.Channel]:
    channel = grpc.insecure_channel(
        _grpc_target(endpoint),
        options=[("grpc.max_receive_message_length", _MAX_MESSAGE), ("grpc.max_send_message_length", _MAX_MESSAGE)],
    )
    try:
        yield channel
    finally:
        channel.close()


@asynccontextmanager
async def open_image_service(
    endpoint: str,
    *,
    call_timeout: float = DEFAULT_CALL_TIMEOUT,
    pull_timeout: float = DEFAULT_PULL_TIMEOUT,
) -> AsyncIterator[ImageService]:
    """The image service at ``endpoint`` (``unix:///run/containerd/containerd.sock`` or a bare socket path).

    The channel connects lazily: a runtime that is not (yet) listening makes calls fail with
    ``UNAVAILABLE``, not this function. Leaving the block closes the channel and cancels any call
    still running on it.

    Errors: :class:`ValueError` if ``endpoint`` is not a unix socket.
    """
    async with _channel(endpoint) as channel:
        yield ImageService(channel, endpoint=endpoint, call_timeout=call_timeout, pull_timeout=pull_timeout)


@asynccontextmanager
async def open_runtime_service(
    endpoint: str, *, call_timeout: float = DEFAULT_CALL_TIMEOUT
) -> AsyncIterator[RuntimeService]:
    """The runtime service at ``endpoint``; as :func:`open_image_service`."""
    async with _channel(endpoint) as channel:
        yield RuntimeService(channel, endpoint=endpoint, call_timeout=call_timeout)


async def pull_images(
    service: ImagePuller,
    images: Sequence[str],
    *,
    retry_times: int,
    auth_for: Callable[[str], RegistryAuth | None] | None = None,
    log: structlog.typing.FilteringBoundLogger,
    retry_delay: float = PULL_RETRY_DELAY,
) -> tuple[ImageStatus, ...]:
    """Pull each image in order, ``retry_times + 1`` attempts each, ``retry_delay`` seconds apart.

    Returns one status per image, in order: True, or False with a reason (the last attempt's CRI
    error, or why the image reference or its credentials were rejected). The ``Pull`` action
    failed if any status is False; its reason is then :data:`PULL_FAILED_REASON`.

    ``auth_for`` gives an image's registry credentials (``DockerConfig.auth_for``); None pulls all
    anonymously. It is asked once per image; a :class:`ValueError` from it fails that image only.

    Errors: :class:`ValueError` if ``retry_times`` is negative (validate the spec before).
    Cancellation: cancels the pull in progress; the statuses gathered so far are lost.
    """
    if retry_times < 0:
        raise ValueError(f"retryTimes must not be negative, got {retry_times}")
    return tuple(
        [
            await _pull_one(service, image, attempts=retry_times + 1, auth_for=auth_for, log=log, delay=retry_delay)
            for image in images
        ]
    )


async def _pull_one(
    service: ImagePuller,
    image: str,
    *,
    attempts: int,
    auth_for: Callable[[str], RegistryAuth | None] | None,
    log: structlog.typing.FilteringBoundLogger,
    delay: float,
) -> ImageStatus:
    log = log.bind(image=image)
    try:
        auth = auth_for(image) if auth_for is not None else None
    except ValueError as exc:
        # A malformed reference does not get better with retries.
        log.warning("image_pull_rejected", error=str(exc))
        return ImageStatus(image=image, status=ConditionStatus.FALSE, reason=str(exc))
    registry = auth.registry if auth is not None else None
    last: CriError | None = None
    for attempt in range(1, attempts + 1):
        if last is not None:
            await anyio.sleep(delay)
        try:
            image_ref = await service.pull(image, auth)
        except CriError as exc:
            last = exc
            log.warning(
                "image_pull_attempt_failed",
                attempt=attempt,
                attempts=attempts,
                code=exc.code,
                error=exc.details,
                auth_registry=registry,
            )
            continue
        log.info("image_pulled", image_ref=image_ref, attempt=attempt, auth_registry=registry)
        return ImageStatus(image=image, status=ConditionStatus.TRUE)
    assert last is not None  # attempts >= 1 and every attempt failed
    noun = "attempt" if attempts == 1 else "attempts"
    return ImageStatus(
        image=image,
        status=ConditionStatus.FALSE,
        reason=f"{last.code}: {last.details} (after {attempts} {noun})",
    )


async def _call(
    callable_: grpc.UnaryUnaryMultiCallable[_Req, _Resp], request: _Req, *, method: str, image: str, deadline: float
) -> _Resp:
    """One unary call with a gRPC deadline in seconds, waited for in a worker thread.

    See the module docstring for cancellation.
    """
    # grpc-stubs leave Call.cancel untyped; the same object is also a typed grpc.Future.
    future = cast("grpc.Future[_Resp]", callable_.future(request, timeout=deadline))
    try:
        return await anyio.to_thread.run_sync(future.result, abandon_on_cancel=True)
    except grpc.RpcError as exc:
        raise CriError(method=method, image=image, code=_code_name(exc), details=exc.details() or "") from None
    finally:
        # A no-op once the call has finished; on cancellation it stops the RPC and wakes the thread.
        future.cancel()


def _code_name(exc: grpc.RpcError) -> str:
    code = exc.code()
    return code.name if isinstance(code, grpc.StatusCode) else str(code)


def _auth_config(auth: RegistryAuth | None) -> api.AuthConfig | None:
    # server_address stays empty, as the kubelet leaves it: containerd compares the URL host of a
    # server_address with each host it pulls from and silently drops the credentials on a
    # mismatch (Docker Hub is served by registry-1.docker.io) or fails on a bare "host:port".
    # The credentials were already chosen for this image's registry (registry_auth).
    if auth is None:
        return None
    return api.AuthConfig(
        username=auth.username,
        password=auth.password,
        identity_token=auth.identity_token,
        registry_token=auth.registry_token,
    )


def _image_info(image: api.Image) -> ImageInfo:
    return ImageInfo(
        id=image.id,
        repo_tags=tuple(image.repo_tags),
        repo_digests=tuple(image.repo_digests),
        size=image.size,
    )


def _container_info(container: api.Container) -> ContainerInfo:
    return ContainerInfo(
        id=container.id,
        name=container.metadata.name,
        attempt=container.metadata.attempt,
        pod_sandbox_id=container.pod_sandbox_id,
        image=container.image.image,
        image_ref=container.image_ref,
        state=_state_name(container.state),
        created_at_ns=container.created_at,
        labels=dict(container.labels),
    )


def _state_name(state: int) -> str:
    try:
        return api.ContainerState.Name(state)
    except ValueError:  # a state newer than this copy of the API
        return f"CONTAINER_STATE_{state}"


def _grpc_target(endpoint: str) -> str:
    if endpoint.startswith("unix://"):
        path = endpoint.removeprefix("unix://")
    elif endpoint.startswith("/"):
        path = endpoint
    else:
        raise ValueError(f"CRI endpoint {endpoint!r} is not a unix socket (unix:///path or /path)")
    if not path.startswith("/"):
        raise ValueError(f"CRI endpoint {endpoint!r} must name an absolute socket path")
    return f"unix://{path}"
