"""Image pulls through the CRI ImageService: the wire contract, the Pull action's retry semantics, and a real
containerd pulling from real registries (open and with basic auth) on loopback."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import structlog
import structlog.testing
import trio
import trio.testing

from roles.common.registry_auth import RegistryAuth, parse_docker_config_json
from roles.edge.runtime.cri import CriError, ImageService, open_image_service, pull_images
from roles.edge.runtime.cri_pb import api_pb2
from schemas.meta import ConditionStatus
from schemas.v1alpha2 import ImageStatus
from tools.provision.containerd import Containerd, Registry

CRI_PB = Path(api_pb2.__file__).parent
REPO = Path(__file__).resolve().parents[2]
TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


@pytest.fixture
def capture() -> structlog.testing.CapturingLogger:
    """Where this test's log events go (no global structlog configuration involved)."""
    return structlog.testing.CapturingLogger()


@pytest.fixture
def log(capture: structlog.testing.CapturingLogger) -> structlog.typing.FilteringBoundLogger:
    """A bound logger writing event dicts to ``capture``."""
    wrapper = structlog.make_filtering_bound_logger(logging.DEBUG)
    logger: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(capture, wrapper_class=wrapper, processors=[])
    return logger


# --------------------------------------------------------------------------------- the wire contract


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("PullImageRequest", {"image": 1, "auth": 2}),
        ("PullImageResponse", {"image_ref": 1}),
        ("ImageSpec", {"image": 1, "annotations": 2}),
        (
            "AuthConfig",
            {
                "username": 1,
                "password": 2,
                "auth": 3,
                "server_address": 4,
                "identity_token": 5,
                "registry_token": 6,
            },
        ),
        ("ImageStatusRequest", {"image": 1, "verbose": 2}),
        ("ImageStatusResponse", {"image": 1, "info": 2}),
        ("Image", {"id": 1, "repo_tags": 2, "repo_digests": 3, "size": 4}),
        ("ListImagesRequest", {"filter": 1}),
        ("ImageFilter", {"image": 1}),
        ("ListImagesResponse", {"images": 1}),
        ("RemoveImageRequest", {"image": 1}),
        ("ListContainersRequest", {}),
        ("ListContainersResponse", {"containers": 1}),
        ("ContainerMetadata", {"name": 1, "attempt": 2}),
        (
            "Container",
            {
                "id": 1,
                "pod_sandbox_id": 2,
                "metadata": 3,
                "image": 4,
                "image_ref": 5,
                "state": 6,
                "created_at": 7,
                "labels": 8,
            },
        ),
    ],
)
def test_cri_messages_carry_the_published_field_numbers(message: str, fields: dict[str, int]) -> None:
    """Names and numbers are k8s.io/cri-api runtime/v1 api.proto's, in package runtime.v1."""
    descriptor = api_pb2.DESCRIPTOR.message_types_by_name[message]
    assert descriptor.full_name == f"runtime.v1.{message}"
    assert {f.name: f.number for f in descriptor.fields} == fields


def test_cri_service_has_the_published_method_paths() -> None:
    """The four image RPCs are runtime.v1.ImageService's, ListContainers the RuntimeService's, with upstream types."""
    service = api_pb2.DESCRIPTOR.services_by_name["ImageService"]
    assert service.full_name == "runtime.v1.ImageService"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "ListImages": ("ListImagesRequest", "ListImagesResponse"),
        "ImageStatus": ("ImageStatusRequest", "ImageStatusResponse"),
        "PullImage": ("PullImageRequest", "PullImageResponse"),
        "RemoveImage": ("RemoveImageRequest", "RemoveImageResponse"),
    }
    runtime = api_pb2.DESCRIPTOR.services_by_name["RuntimeService"]
    assert runtime.full_name == "runtime.v1.RuntimeService"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in runtime.methods} == {
        "ListContainers": ("ListContainersRequest", "ListContainersResponse"),
    }
    states = api_pb2.DESCRIPTOR.enum_types_by_name["ContainerState"]
    assert {v.name: v.number for v in states.values} == {
        "CONTAINER_CREATED": 0,
        "CONTAINER_RUNNING": 1,
        "CONTAINER_EXITED": 2,
        "CONTAINER_UNKNOWN": 3,
    }


def test_committed_cri_code_is_generated_from_the_proto(tmp_path: Path) -> None:
    """api_pb2.py and api_pb2.pyi are what grpc_tools.protoc makes of api.proto today (`just cri-proto`)."""
    relative = CRI_PB.relative_to(REPO)
    proto = relative / "api.proto"
    argv = ["-I", ".", f"--python_out={tmp_path}", f"--pyi_out={tmp_path}", str(proto)]
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *argv], cwd=REPO, check=True)
    for name in ("api_pb2.py", "api_pb2.pyi"):
        assert (tmp_path / relative / name).read_text() == (CRI_PB / name).read_text(), f"{name} is stale"


# --------------------------------------------------------------------------------- Pull semantics (virtual time)


class FakePuller:
    """Fails each image a scripted number of times, recording every attempt with its loop time."""

    def __init__(self, failures: dict[str, int]) -> None:
        self.failures = dict(failures)
        self.attempts: list[tuple[str, float, RegistryAuth | None]] = []

    async def pull(self, image: str, auth: RegistryAuth | None = None) -> str:
        self.attempts.append((image, trio.current_time(), auth))
        await trio.sleep(0.1)  # the pull itself takes time too
        if self.failures.get(image, 0) > 0:
            self.failures[image] -= 1
            raise CriError(method="PullImage", image=image, code="NOT_FOUND", details=f"{image}: not found")
        return f"sha256:{image}"


async def test_each_image_gets_retry_times_plus_one_attempts_half_a_second_apart(
    autojump_clock: trio.testing.MockClock,
    log: structlog.typing.FilteringBoundLogger,
    capture: structlog.testing.CapturingLogger,
) -> None:
    """retryTimes=2 means three attempts 0.5 s apart (after the failed pull ends); the last error is the reason."""
    fake = FakePuller({"a": 99, "b": 2})
    statuses = await pull_images(fake, ["a", "b"], retry_times=2, log=log)
    assert statuses == (
        ImageStatus(image="a", status=FALSE, reason="NOT_FOUND: a: not found (after 3 attempts)"),
        ImageStatus(image="b", status=TRUE),
    )
    assert [(image, round(t, 3)) for image, t, _ in fake.attempts] == [
        ("a", 0.0),
        ("a", 0.6),
        ("a", 1.2),
        ("b", 1.3),
        ("b", 1.9),
        ("b", 2.5),
    ]
    assert trio.current_time() == pytest.approx(2.6)
    events = [(call.method_name, call.kwargs["event"], call.kwargs["image"]) for call in capture.calls]
    assert events == [
        *[("warning", "image_pull_attempt_failed", "a")] * 3,
        *[("warning", "image_pull_attempt_failed", "b")] * 2,
        ("info", "image_pulled", "b"),
    ]


async def test_one_failing_image_does_not_re_pull_the_others(
    autojump_clock: trio.testing.MockClock, log: structlog.typing.FilteringBoundLogger
) -> None:
    """Images are pulled in order, each once on success, and each gets its own status (unlike KubeEdge)."""
    fake = FakePuller({"missing": 99})
    statuses = await pull_images(fake, ["one", "missing", "two"], retry_times=1, log=log)
    assert [s.status for s in statuses] == [TRUE, FALSE, TRUE]
    assert [image for image, _, _ in fake.attempts] == ["one", "missing", "missing", "two"]


async def test_zero_retries_means_one_attempt(
    autojump_clock: trio.testing.MockClock, log: structlog.typing.FilteringBoundLogger
) -> None:
    """retryTimes=0 pulls once and does not wait after a failure."""
    fake = FakePuller({"a": 1})
    statuses = await pull_images(fake, ["a"], retry_times=0, log=log)
    assert statuses[0].reason == "NOT_FOUND: a: not found (after 1 attempt)"
    assert trio.current_time() == pytest.approx(0.1)


async def test_each_image_is_pulled_with_its_own_registry_credentials(
    autojump_clock: trio.testing.MockClock, log: structlog.typing.FilteringBoundLogger
) -> None:
    """auth_for is asked per image; an image it rejects fails at once, without a pull."""
    cfg = parse_docker_config_json('{"auths": {"reg.example.com": {"username": "u", "password": "p"}}}')
    fake = FakePuller({})
    statuses = await pull_images(
        fake, ["reg.example.com/app:v1", "nginx", "Bad//Ref"], retry_times=3, auth_for=cfg.auth_for, log=log
    )
    assert [(image, auth) for image, _, auth in fake.attempts] == [
        ("reg.example.com/app:v1", RegistryAuth("reg.example.com", "u", "p")),
        ("nginx", None),
    ]
    assert statuses[2].status is FALSE
    assert statuses[2].reason == "image reference 'Bad//Ref': the repository name must be lowercase"


async def test_a_negative_retry_count_is_refused(log: structlog.typing.FilteringBoundLogger) -> None:
    """A negative retryTimes is a spec error, not an endless retry (avast/retry-go's Attempts(0))."""
    with pytest.raises(ValueError, match="retryTimes must not be negative, got -1"):
        await pull_images(FakePuller({}), ["a"], retry_times=-1, log=log)


async def test_an_empty_image_list_succeeds_with_no_statuses(log: structlog.typing.FilteringBoundLogger) -> None:
    """No images: nothing to pull, nothing failed (KubeEdge reports an empty imageStatus too)."""
    assert await pull_images(FakePuller({}), [], retry_times=5, log=log) == ()


# --------------------------------------------------------------------------------- a real containerd


class CountingPuller:
    """A real image service that also counts PullImage calls per image."""

    def __init__(self, service: ImageService) -> None:
        self.service = service
        self.calls: dict[str, int] = {}

    async def pull(self, image: str, auth: RegistryAuth | None = None) -> str:
        self.calls[image] = self.calls.get(image, 0) + 1
        return await self.service.pull(image, auth)


@pytest.mark.integration
async def test_pulling_an_existing_image_reports_true_and_the_runtime_then_has_it(
    containerd: Containerd, registry: Registry, log: structlog.typing.FilteringBoundLogger
) -> None:
    """The image is absent, the Pull action reports True, and ImageStatus then finds it under its tag."""
    image = registry.push("prepull/present", "v1")
    with anyio.fail_after(30):
        async with open_image_service(containerd.endpoint) as service:
            assert await service.status(image) is None
            statuses = await pull_images(service, [image], retry_times=0, log=log)
            assert statuses == (ImageStatus(image=image, status=TRUE),)
            info = await service.status(image)
            assert info is not None
            assert image in info.repo_tags
            assert info.id.startswith("sha256:")
            assert info.size > 0
            assert info.id in {i.id for i in await service.list_images()}
            await service.remove(image)
            assert await service.status(image) is None


@pytest.mark.integration
async def test_a_missing_image_fails_after_every_retry_with_the_runtime_reason(
    containerd: Containerd, registry: Registry, log: structlog.typing.FilteringBoundLogger
) -> None:
    """retryTimes=2 makes three real PullImage calls, 0.5 s apart, and reports False with containerd's reason."""
    image = f"{registry.host}/prepull/absent:v1"
    with anyio.fail_after(30):
        async with open_image_service(containerd.endpoint) as service:
            counting = CountingPuller(service)
            started = anyio.current_time()
            (status,) = await pull_images(counting, [image], retry_times=2, log=log)
            elapsed = anyio.current_time() - started
    assert counting.calls == {image: 3}
    assert elapsed >= 1.0
    assert status.status is FALSE
    assert status.reason.startswith("NOT_FOUND: ")
    assert "not found" in status.reason
    assert status.reason.endswith("(after 3 attempts)")


@pytest.mark.integration
async def test_a_registry_that_needs_credentials_serves_only_the_secret_holder(
    containerd: Containerd, auth_registry: Registry, log: structlog.typing.FilteringBoundLogger
) -> None:
    """Anonymous and wrong-password pulls fail with a 401; the dockerconfigjson Secret's credentials succeed."""
    image = auth_registry.push("prepull/private", "v1")
    secret = parse_docker_config_json(auth_registry.docker_config_json())
    wrong = RegistryAuth(auth_registry.host, auth_registry.username, "wrong")
    with anyio.fail_after(30):
        async with open_image_service(containerd.endpoint) as service:
            (anonymous,) = await pull_images(service, [image], retry_times=0, log=log)
            (bad,) = await pull_images(service, [image], retry_times=0, auth_for=lambda _: wrong, log=log)
            assert await service.status(image) is None
            (good,) = await pull_images(service, [image], retry_times=0, auth_for=secret.auth_for, log=log)
            assert await service.status(image) is not None
    for failed in (anonymous, bad):
        assert failed.status is FALSE
        assert "401 Unauthorized" in failed.reason
    assert good == ImageStatus(image=image, status=TRUE)


@pytest.mark.integration
async def test_several_images_with_one_failing_get_per_image_statuses(
    containerd: Containerd, registry: Registry, auth_registry: Registry, log: structlog.typing.FilteringBoundLogger
) -> None:
    """An open image, a missing one and a private one (credentials matched by host) report True, False, True."""
    images = [
        registry.push("prepull/many-a", "v1"),
        f"{registry.host}/prepull/many-missing:v1",
        auth_registry.push("prepull/many-b", "v2"),
    ]
    secret = parse_docker_config_json(auth_registry.docker_config_json())
    with anyio.fail_after(30):
        async with open_image_service(containerd.endpoint) as service:
            statuses = await pull_images(service, images, retry_times=1, auth_for=secret.auth_for, log=log)
            present = [await service.status(image) is not None for image in images]
    assert [(s.image, s.status) for s in statuses] == list(zip(images, [TRUE, FALSE, TRUE], strict=True))
    assert "not found" in statuses[1].reason
    assert present == [True, False, True]


@pytest.mark.integration
async def test_cancelling_a_pull_returns_at_once_and_stops_it_in_the_runtime(
    containerd: Containerd, black_hole: str
) -> None:
    """A pull from a registry that never answers is abandoned on cancellation and containerd sees the cancel."""
    containerd.allow_plain_http(black_hole)
    image = f"{black_hole}/prepull/hangs:v1"
    async with open_image_service(containerd.endpoint) as service:
        started = anyio.current_time()
        with anyio.move_on_after(0.5) as scope:
            await service.pull(image)
        assert scope.cancelled_caught
        assert anyio.current_time() - started < 1.5
        # containerd logs the aborted pull shortly after the client's cancel reaches it.
        for _ in range(200):
            if "context canceled" in _log_lines_about(containerd, image):
                break
            await anyio.sleep(0.05)
        else:
            pytest.fail(f"containerd never logged the cancelled pull of {image}")


async def test_an_unreachable_runtime_is_a_cri_error_naming_the_image(tmp_path: Path) -> None:
    """No runtime on the socket: UNAVAILABLE, with the call and the image in the message."""
    with anyio.fail_after(10):
        async with open_image_service(f"unix://{tmp_path}/absent.sock") as service:
            with pytest.raises(CriError, match=r"^PullImage example\.com/app:v1: UNAVAILABLE: ") as info:
                await service.pull("example.com/app:v1")
    assert info.value.code == "UNAVAILABLE"


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1:1", "containerd.sock", "unix://relative.sock"])
async def test_a_non_unix_endpoint_is_refused(endpoint: str) -> None:
    """CRI endpoints on Linux are unix sockets; anything else is a ValueError naming it."""
    with pytest.raises(ValueError, match="CRI endpoint"):
        async with open_image_service(endpoint):
            pass


def _log_lines_about(containerd: Containerd, image: str) -> str:
    text = containerd.process.log.read_text(errors="replace")
    return "\n".join(line for line in text.splitlines() if image in line)
