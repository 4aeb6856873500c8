"""Image pulls in a child process: results, credentials, a child that fails, and cancellation."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

import anyio
import msgspec
import psutil
import pytest
import structlog
import structlog.testing

import roles
from roles.common.registry_auth import RegistryAuth
from roles.edge.runtime.puller import CHILD, PullRequest, _child_environment, pull_in_child, request_for
from schemas.meta import ConditionStatus
from schemas.v1alpha2 import ImageStatus
from tools.provision.containerd import Containerd, Registry

TRUE, FALSE = ConditionStatus.TRUE, ConditionStatus.FALSE


@pytest.fixture
def log() -> structlog.typing.FilteringBoundLogger:
    """A bound logger that keeps its events in memory."""
    wrapper = structlog.make_filtering_bound_logger(logging.DEBUG)
    logger: structlog.typing.FilteringBoundLogger = structlog.wrap_logger(
        structlog.testing.CapturingLogger(), wrapper_class=wrapper, processors=[]
    )
    return logger


def _request(endpoint: str, images: tuple[str, ...], refused: dict[str, str] | None = None) -> PullRequest:
    return PullRequest(endpoint=endpoint, images=images, retry_times=0, refused=refused or {}, log_level="warning")


def test_credentials_are_asked_once_per_image_and_refusals_are_kept_with_their_reason() -> None:
    """The request carries each image's credentials, and why an image had none it could use."""
    secret = RegistryAuth("reg.example:5000", "user", "pw")

    def auth_for(image: str) -> RegistryAuth | None:
        if image.startswith("bad"):
            raise ValueError("bad reference")
        return secret if image.startswith("reg.example") else None

    request = request_for(
        "unix:///run/x.sock",
        ("reg.example:5000/a:1", "open/b:2", "bad//c"),
        1,
        auth_for,
        log_level="info",
        log_format="json",
        log_context={"node": "n1"},
    )
    assert request.credentials == {"reg.example:5000/a:1": secret}
    assert request.refused == {"bad//c": "bad reference"}
    assert request.log_context == {"node": "n1"}
    # What the child decodes from its stdin, typed as the agent sent it.
    assert msgspec.json.decode(msgspec.json.encode(request), type=PullRequest) == request


async def test_an_unreachable_runtime_fails_each_image_with_the_runtime_error(
    tmp_path: Path, log: structlog.typing.FilteringBoundLogger
) -> None:
    """The child answers one False status per image, with the CRI error, and a refused image without a try."""
    request = _request(f"unix://{tmp_path}/none.sock", ("a/b:1", "c/d:2"), refused={"c/d:2": "no credentials"})
    with anyio.fail_after(30):
        statuses = await pull_in_child(request, log=log)
    assert [(s.image, s.status) for s in statuses] == [("a/b:1", FALSE), ("c/d:2", FALSE)]
    assert statuses[0].reason.startswith("UNAVAILABLE")
    assert statuses[1].reason == "no credentials"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import sys; sys.exit(7)", "the image puller exited with status 7"),
        ("print('not json')", "the image puller answered garbage"),
        ("print('[]')", "the image puller answered for other images"),
    ],
)
async def test_a_child_that_fails_fails_every_image_with_a_reason(
    code: str, reason: str, log: structlog.typing.FilteringBoundLogger
) -> None:
    """A child that dies, or answers something else than the statuses asked for, is never mistaken for success."""
    request = _request("unix:///run/x.sock", ("a/b:1", "c/d:2"))
    with anyio.fail_after(30):
        statuses = await pull_in_child(request, log=log, command=(sys.executable, "-c", code))
    assert [s.status for s in statuses] == [FALSE, FALSE]
    assert all(s.reason.startswith(reason) for s in statuses)


async def test_a_child_that_ends_before_reading_a_large_request_fails_the_images_without_raising(
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """A request larger than the pipe meets a child that is already gone: a reason per image, no exception."""
    images = tuple(f"registry.example/app-{i}:v1" for i in range(20_000))
    request = _request("unix:///run/x.sock", images)
    with anyio.fail_after(30):
        statuses = await pull_in_child(request, log=log, command=(sys.executable, "-c", "pass"))
    assert len(statuses) == len(images)
    assert all(s.status is FALSE and s.reason.startswith("the image puller answered garbage") for s in statuses)


async def test_a_child_that_answers_too_much_is_stopped_and_fails_the_images(
    log: structlog.typing.FilteringBoundLogger,
) -> None:
    """Output beyond any real answer ends the child at once instead of waiting for it."""
    flood = "import sys; sys.stdout.buffer.write(b'x' * (8 << 20)); sys.stdout.flush(); import time; time.sleep(60)"
    request = _request("unix:///run/x.sock", ("a/b:1",))
    with anyio.fail_after(20):
        statuses = await pull_in_child(request, log=log, command=(sys.executable, "-c", flood))
    assert statuses == (ImageStatus(image="a/b:1", status=FALSE, reason="the image puller answered too much"),)


def test_the_child_runs_the_agents_own_code_first_and_never_the_working_directory() -> None:
    """The agent's code directory (resolved) leads the child's PYTHONPATH, and the child runs with -P."""
    env = _child_environment()
    first = env["PYTHONPATH"].split(os.pathsep)[0]
    assert Path(first) == Path(roles.__file__).resolve().parent.parent
    assert "-P" in CHILD


@pytest.mark.integration
async def test_pulls_through_containerd_with_credentials_per_image(
    containerd: Containerd, registry: Registry, auth_registry: Registry, log: structlog.typing.FilteringBoundLogger
) -> None:
    """An open image, a missing one and a private one pulled by the child report True, False, True."""
    images = (
        registry.push("puller/open", "v1"),
        f"{registry.host}/puller/missing:v1",
        auth_registry.push("puller/private", "v1"),
    )
    credentials = RegistryAuth(auth_registry.host, auth_registry.username, auth_registry.password)
    request = request_for(
        containerd.endpoint,
        images,
        0,
        lambda image: credentials if image.startswith(auth_registry.host) else None,
        log_level="warning",
        log_format="console",
        log_context={},
    )
    with anyio.fail_after(60):
        statuses = await pull_in_child(request, log=log)
    assert statuses[0] == ImageStatus(image=images[0], status=TRUE)
    assert statuses[1].status is FALSE
    assert "not found" in statuses[1].reason
    assert statuses[2] == ImageStatus(image=images[2], status=TRUE)


@pytest.mark.integration
async def test_cancelling_a_pull_ends_the_child(
    containerd: Containerd, black_hole: str, log: structlog.typing.FilteringBoundLogger
) -> None:
    """A pull from a registry that never answers is cancelled by ending its child process."""
    containerd.allow_plain_http(black_hole)
    request = _request(containerd.endpoint, (f"{black_hole}/puller/hangs:v1",))
    me = psutil.Process()
    before = {p.pid for p in me.children()}
    async with anyio.create_task_group() as tg:
        tg.start_soon(functools.partial(pull_in_child, request, log=log))
        with anyio.fail_after(10):
            while True:
                children = [p for p in me.children() if p.pid not in before]
                if children:
                    break
                await anyio.sleep(0.05)
        await anyio.sleep(0.5)
        tg.cancel_scope.cancel()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in children)
