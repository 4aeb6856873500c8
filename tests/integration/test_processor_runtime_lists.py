"""containers.list and images.list against the real containerd the tests provision, through the CRI child."""

from __future__ import annotations

import msgspec
import pytest
import trio

from roles.edge import processors
from roles.edge.runtime.puller import PullRequest, pull_in_child
from schemas.meta import ConditionStatus
from schemas.processors import Builtin, Processor
from tests.unit.roles.edge.processors.doubles import make_env
from tools.provision.containerd import Containerd, Registry


def builtin(name: str) -> Processor:
    return Processor(builtin=Builtin(name=name), timeout_seconds=60)


@pytest.mark.integration
async def test_images_list_shows_an_image_the_runtime_pulled(containerd: Containerd, registry: Registry) -> None:
    """An image pulled into containerd appears in images.list with its tag and size; the count matches."""
    image = registry.push("diagnosis/listed", "v1")
    env = make_env(cri_endpoint=containerd.endpoint)
    with trio.fail_after(60):
        pulled = await pull_in_child(
            PullRequest(endpoint=containerd.endpoint, images=(image,), retry_times=0, log_level="warning"),
            log=env.logger,
        )
        assert pulled[0].status is ConditionStatus.TRUE, pulled[0].reason
        outcome = await processors.run(builtin("images.list"), {}, env)
    assert outcome.succeeded, outcome.reason
    items = msgspec.json.decode(outcome.results["images.list.items"])
    assert int(outcome.results["images.list.count"]) == len(items) == int(outcome.results["images.list.shown"])
    listed = next(i for i in items if image in i["tags"])
    assert listed["size"] > 0
    assert len(listed["id"]) == 13
    assert int(outcome.results["images.list.bytes"]) >= listed["size"]


@pytest.mark.integration
async def test_containers_list_answers_through_the_runtime_service(containerd: Containerd) -> None:
    """The runtime runs no pod here: the listing succeeds, empty, which proves the RuntimeService call."""
    with trio.fail_after(60):
        outcome = await processors.run(builtin("containers.list"), {}, make_env(cri_endpoint=containerd.endpoint))
    assert outcome.succeeded, outcome.reason
    assert outcome.results == {
        "containers.list.count": "0",
        "containers.list.running": "0",
        "containers.list.items": "[]",
        "containers.list.shown": "0",
    }


@pytest.mark.integration
async def test_a_runtime_that_does_not_answer_fails_the_listing_with_its_status() -> None:
    """No runtime at the endpoint: the Task fails naming the endpoint and the gRPC status."""
    endpoint = "unix:///nonexistent/diagnosis/containerd.sock"
    with trio.fail_after(60):
        outcome = await processors.run(builtin("containers.list"), {}, make_env(cri_endpoint=endpoint))
    assert not outcome.succeeded
    assert outcome.reason.startswith(f"the container runtime at {endpoint} did not list its containers: ")
    assert "ListContainers: UNAVAILABLE" in outcome.reason
