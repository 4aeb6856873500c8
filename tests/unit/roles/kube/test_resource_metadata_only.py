"""Which reads of a resource ask the API server for each object's metadata only, in which media type, and what an
empty answer of metadata only looks like."""

from __future__ import annotations

from typing import Any, cast

import pytest

from roles.kube.aio import AioApi
from roles.kube.resources import JSON, NODE_METADATA, NODES, RAW_CONFIG_MAPS, RAW_NODES, RAW_PODS, RAW_SECRETS, Resource
from roles.kube.watching import list_objects

PARTIAL = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
PARTIAL_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


@pytest.mark.parametrize(
    ("resource", "snapshot_list", "other_list", "one"),
    [
        (NODES, JSON, JSON, JSON),
        (RAW_PODS, JSON, JSON, JSON),  # a Pod's head needs its spec.nodeName
        (RAW_NODES, PARTIAL_LIST, JSON, JSON),
        (RAW_CONFIG_MAPS, PARTIAL_LIST, JSON, JSON),
        (RAW_SECRETS, PARTIAL_LIST, JSON, JSON),
        (NODE_METADATA, PARTIAL_LIST, PARTIAL_LIST, PARTIAL),
    ],
)
def test_each_read_asks_for_whole_objects_or_for_metadata_only_as_its_resource_says(
    resource: Resource[Any],
    snapshot_list: str,
    other_list: str,
    one: str,
) -> None:
    """A watch's snapshot, any other list, and one object or a watch's change: each with its own Accept header,
    falling back to whole objects where an API server cannot serve metadata alone."""
    assert resource.accept(collection=True, snapshot=True) == snapshot_list
    assert resource.accept(collection=True) == other_list
    assert resource.accept(collection=False) == one


class OneAnswer:
    """An API client answering every request with ``body``; it keeps each request's Accept header."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.accepted: list[str] = []

    async def request(self, method: str, path: str, *, accept: str, **_: Any) -> bytes:
        self.accepted.append(accept)
        return self.body


async def test_an_empty_metadata_only_snapshot_lists_nothing() -> None:
    """The API server sends an empty PartialObjectMetadataList's items as null: no objects, and no error."""
    api = OneAnswer(b'{"kind": "PartialObjectMetadataList", "metadata": {"resourceVersion": "7"}, "items": null}')
    listed = await list_objects(cast("AioApi", api), RAW_CONFIG_MAPS, snapshot=True)
    assert listed == ([], [], "7")
    assert api.accepted == [PARTIAL_LIST]
