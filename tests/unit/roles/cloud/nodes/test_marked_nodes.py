"""Marked Nodes: a Node already carrying this hub's id and the agent's version is not written again."""

from __future__ import annotations

import msgspec
import pytest
import structlog
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from roles.cloud.hub import Hub
from roles.cloud.nodes.marked_nodes import MarkedNodes, mark_needed, own_version
from roles.cloud.nodes.marks import FAILED, SKIPPED, WRITTEN
from roles.kube import Deleted, Interrupted, Relisted, Upserted
from roles.kube.resources import NODES
from schemas.core import AGENT_VERSION_ANNOTATION, HUB_ANNOTATION, MarkAnnotations, Node, NodeHead, RawObject
from schemas.meta import ObjectMeta
from tests.unit.roles.cloud.cache_world import until
from tests.unit.roles.cloud.doubles import MemoryApi, running_hub

HUB = "hub-a"
"""The hub id of :func:`tests.unit.roles.cloud.doubles.running_hub`."""

maybe_text = st.one_of(st.none(), st.sampled_from([HUB, "hub-b", "v1", "v2", ""]), st.text(max_size=8))


@given(hub=maybe_text, version=maybe_text, session_version=st.text(max_size=8))
def test_a_mark_is_skipped_only_for_a_node_saying_this_hub_and_the_sessions_version(
    hub: str | None, version: str | None, session_version: str
) -> None:
    """Whatever a Node's two annotations say, its mark is skipped exactly when they are this hub and this version."""
    marks = MarkAnnotations(hub=hub, agent_version=version)
    skipped = not mark_needed(own_version(marks, HUB), session_version)
    assert skipped == (hub == HUB and version == session_version)


@pytest.mark.parametrize(
    ("hub", "version", "session_version", "needed"),
    [
        (HUB, "v1", "v1", False),  # a reconnect to a restarted hub
        (HUB, "v1", "v2", True),  # the agent was upgraded
        ("hub-b", "v1", "v1", True),  # another hub holds the node
        (None, "v1", "v1", True),  # unmarked (the version stays when a session ends)
        (HUB, None, "v1", True),  # this hub's id without a version
        (HUB, None, "", True),  # an absent version is not the empty one
        (HUB, "", "", False),
    ],
)
def test_mark_needed_by_case(hub: str | None, version: str | None, session_version: str, needed: bool) -> None:
    """The cases a hub meets, one per row."""
    assert mark_needed(own_version(MarkAnnotations(hub=hub, agent_version=version), HUB), session_version) is needed


def _annotations(hub: str | None, version: str | None) -> dict[str, str]:
    pairs = ((HUB_ANNOTATION, hub), (AGENT_VERSION_ANNOTATION, version))
    return {key: value for key, value in pairs if value is not None}


def _raw(name: str, hub: str | None = None, version: str | None = None) -> RawObject:
    """A Node as the watch delivers its changes (whole, undecoded)."""
    node = Node(metadata=ObjectMeta(name=name, annotations=_annotations(hub, version)))
    return msgspec.json.decode(msgspec.json.encode(node), type=RawObject)


def _head(name: str, hub: str | None = None, version: str | None = None) -> NodeHead:
    """A Node as the watch's snapshot holds it."""
    node = Node(metadata=ObjectMeta(name=name, annotations=_annotations(hub, version)))
    return msgspec.json.decode(msgspec.json.encode(node), type=NodeHead)


def _book() -> MarkedNodes:
    return MarkedNodes(None, hub_id=HUB, log=structlog.get_logger())


def test_nothing_is_known_before_the_watch_has_listed_the_nodes() -> None:
    """Changes seen before the first list are kept, but trusted only once the list has come."""
    book = _book()
    book.apply(Upserted(_raw("n1", HUB, "v1")))
    assert book.seen("n1") is None
    book.apply(Relisted((_head("n1", HUB, "v1"), _head("n2", "hub-b", "v1"), _head("n3"))))
    assert (book.seen("n1"), book.seen("n2"), book.seen("n3")) == ("v1", None, None)
    assert len(book) == 1  # only this hub's Nodes are kept


def test_each_change_of_a_node_replaces_what_is_known_of_its_mark() -> None:
    """A Node marked by another hub, unmarked, or deleted is no longer known as this hub's."""
    book = _book()
    book.apply(Relisted((_head("n1", HUB, "v1"), _head("n2", HUB, "v1"), _head("n3", HUB, "v1"))))
    book.apply(Upserted(_raw("n1", "hub-b", "v1")))
    book.apply(Upserted(_raw("n2", None, "v1")))
    book.apply(Deleted(_raw("n3", HUB, "v1")))
    book.apply(Upserted(_raw("n4", HUB, "v2")))
    assert [book.seen(n) for n in ("n1", "n2", "n3", "n4")] == [None, None, None, "v2"]


def test_a_failed_watch_is_not_trusted_until_it_lists_again() -> None:
    """From an interruption until the next list (which may miss changes made meanwhile), every mark is written."""
    book = _book()
    book.apply(Relisted((_head("n1", HUB, "v1"),)))
    book.apply(Interrupted("connection refused"))
    assert book.seen("n1") is None
    book.apply(Relisted((_head("n1", "hub-b", "v1"), _head("n2", HUB, "v1"))))
    assert (book.seen("n1"), book.seen("n2")) == (None, "v1")


def test_a_node_change_that_cannot_be_read_forgets_every_node() -> None:
    """Which Node changed is unknown, so none is trusted to carry this hub's mark any more."""
    book = _book()
    book.apply(Relisted((_head("n1", HUB, "v1"), _head("n2", HUB, "v1"))))
    book.apply(Upserted(RawObject(metadata=msgspec.Raw(b'{"name": 7}'))))
    assert (book.seen("n1"), book.seen("n2")) == (None, None)
    book.apply(Upserted(_raw("n2", HUB, "v1")))
    assert book.seen("n2") == "v1"


async def test_a_mark_awaiting_its_node_is_told_when_the_watch_lists_or_changes_a_node_of_that_name() -> None:
    """A relist holding the Node or a change of it sets the event; other Nodes and deletions do not, and a block left
    leaves nothing behind."""
    book = _book()
    with book.awaiting("n1") as listed, book.awaiting("n2") as changed, book.awaiting("n2") as too:
        book.apply(Relisted((_head("n0"),)))
        book.apply(Upserted(_raw("n3")))
        book.apply(Deleted(_raw("n2")))
        assert [listed.is_set(), changed.is_set(), too.is_set()] == [False] * 3
        book.apply(Relisted((_head("n0"), _head("n1"))))
        book.apply(Upserted(_raw("n2", "hub-b", "v1")))
        assert [listed.is_set(), changed.is_set(), too.is_set()] == [True] * 3
    with book.awaiting("n4"):
        pass
    assert book._awaited == {}


def _settled(hub: Hub) -> dict[str, float]:
    (metric,) = hub.metrics.node_marks.collect()
    return {s.labels["outcome"]: s.value for s in metric.samples if s.name.endswith("_total")}


@pytest.mark.parametrize("cache_streams", [True, False])
async def test_a_reconnect_writes_only_the_nodes_not_marked_with_this_hub_and_version(
    cache_streams: bool, autojump_clock: trio.testing.MockClock
) -> None:
    """Edges at v1 reconnecting: the Node naming this hub at v1 is not written, those naming another hub or
    version are; the skipped mark still comes off when its session ends. One watch of Nodes either way."""
    api = MemoryApi()
    marks = {"same": (HUB, "v1"), "other": ("hub-b", "v1"), "older": (HUB, "v0"), "none": (None, None)}
    for name, (holder, version) in marks.items():
        api.put(NODES, Node(metadata=ObjectMeta(name=name, annotations=_annotations(holder, version))))
    async with running_hub(api, cache_streams=cache_streams) as (hub, door):
        edges = {name: door.connect(name) for name in marks}
        for edge in edges.values():
            await edge.hello(version="v1")
        await until(lambda: sum(_settled(hub).values()) == 4)
        assert _settled(hub) == {WRITTEN: 3, SKIPPED: 1, FAILED: 0}
        assert sorted(name for plural, name, _ in api.patches if plural == "nodes") == ["none", "older", "other"]
        for name in marks:
            annotations = api.peek(NODES, name).metadata.annotations
            assert (annotations.get(HUB_ANNOTATION), annotations.get(AGENT_VERSION_ANNOTATION)) == (HUB, "v1")
        await edges["same"].close()
        await until(lambda: HUB_ANNOTATION not in api.peek(NODES, "same").metadata.annotations)
    assert api.watches_opened["nodes"] == 1


async def test_a_node_marked_by_another_hub_since_the_list_is_written(autojump_clock: trio.testing.MockClock) -> None:
    """The watch's changes count, not only its first list: a Node another hub marked after it is written again."""
    api = MemoryApi()
    api.put(NODES, Node(metadata=ObjectMeta(name="n1", annotations=_annotations(HUB, "v1"))))
    async with running_hub(api, cache_streams=False) as (hub, door):
        api.put(NODES, Node(metadata=ObjectMeta(name="n1", annotations=_annotations("hub-b", "v1"))))
        await until(lambda: hub.marked_nodes.seen("n1") is None)
        await door.connect("n1").hello(version="v1")
        await until(lambda: sum(_settled(hub).values()) == 1)
        assert _settled(hub)[WRITTEN] == 1
        assert api.peek(NODES, "n1").metadata.annotations[HUB_ANNOTATION] == HUB
