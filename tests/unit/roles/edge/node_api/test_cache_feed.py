"""What the API server's answers to a kubelet put in the device's cache."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from nodetask.messages import CacheDeleted, CacheKey, CacheObjects
from roles.edge.node_api.cache_feed import WatchLines, answer_feed, event_feed, object_target, wants_watch

NODE = "edge-1"
POD: dict[str, Any] = {
    "kind": "Pod",
    "apiVersion": "v1",
    "metadata": {"name": "web", "namespace": "ns", "resourceVersion": "7"},
}
NODE_OBJ: dict[str, Any] = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": NODE, "resourceVersion": "9"}}


def _list(kind: str, *items: dict[str, Any], rv: str = "12") -> bytes:
    return msgspec.json.encode({"kind": f"{kind}List", "metadata": {"resourceVersion": rv}, "items": list(items)})


def _objects(feed: tuple[object, ...]) -> list[dict[str, object]]:
    assert len(feed) == 1
    assert isinstance(feed[0], CacheObjects)
    return [msgspec.json.decode(raw) for raw in feed[0].objects]


def test_the_nodes_pod_list_replaces_the_cached_pods() -> None:
    """A list of pods selected by the node's name is the whole collection: it replaces what is cached."""
    query = {"fieldSelector": [f"spec.nodeName={NODE}"]}
    feed = answer_feed("GET", "/api/v1/pods", query, node=NODE, status=200, body=_list("Pod", POD))
    assert isinstance(feed[0], CacheObjects)
    assert feed[0].replace
    assert feed[0].resource_version == "12"
    assert _objects(feed) == [POD]


def test_a_narrower_list_only_adds_to_the_cache() -> None:
    """A list with a label selector, in a namespace, or of another node is an upsert, never a replace."""
    for path, query in (
        ("/api/v1/pods", {"fieldSelector": [f"spec.nodeName={NODE}"], "labelSelector": ["app=x"]}),
        ("/api/v1/namespaces/ns/pods", {}),
        ("/api/v1/pods", {"fieldSelector": ["spec.nodeName=edge-2"]}),
        ("/api/v1/namespaces/ns/configmaps", {"fieldSelector": ["metadata.name=conf"]}),
    ):
        feed = answer_feed("GET", path, query, node=NODE, status=200, body=_list("Pod", POD))
        assert isinstance(feed[0], CacheObjects)
        assert not feed[0].replace, path


def test_an_object_got_updated_or_patched_is_an_upsert_also_through_its_status() -> None:
    """A Node patched through its status subresource, or a pod got, is cached as the answer has it."""
    body = msgspec.json.encode(NODE_OBJ)
    for method, path in (("PATCH", f"/api/v1/nodes/{NODE}/status"), ("GET", f"/api/v1/nodes/{NODE}")):
        feed = answer_feed(method, path, {}, node=NODE, status=200, body=body)
        assert _objects(feed) == [NODE_OBJ]
        assert isinstance(feed[0], CacheObjects)
        assert feed[0].kind == "Node"
    lease = {"kind": "Lease", "metadata": {"name": NODE, "namespace": "kube-node-lease", "resourceVersion": "3"}}
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
    assert _objects(answer_feed("PUT", path, {}, node=NODE, status=200, body=msgspec.json.encode(lease))) == [lease]


def test_failures_statuses_and_unknown_kinds_feed_nothing() -> None:
    """A refused request, a delete's Status, protobuf, or a kind the device does not keep adds nothing."""
    status = msgspec.json.encode({"kind": "Status", "status": "Success", "metadata": {}})
    pod = msgspec.json.encode(POD)
    assert answer_feed("GET", "/api/v1/namespaces/ns/pods/web", {}, node=NODE, status=403, body=pod) == ()
    assert answer_feed("DELETE", "/api/v1/namespaces/ns/pods/web", {}, node=NODE, status=200, body=status) == ()
    assert answer_feed("GET", "/api/v1/namespaces/ns/pods/web", {}, node=NODE, status=200, body=b"k8s\x00\x0a") == ()
    assert answer_feed("GET", "/api/v1/namespaces/ns/endpoints/web", {}, node=NODE, status=200, body=pod) == ()
    assert answer_feed("GET", "/apis/storage.k8s.io/v1/csidrivers", {}, node=NODE, status=200, body=pod) == ()


def test_watch_events_become_upserts_and_deletions() -> None:
    """ADDED and MODIFIED objects are upserts, DELETED a deletion at its resource version, bookmarks nothing."""
    added = msgspec.json.encode({"type": "ADDED", "object": POD})
    deleted = msgspec.json.encode(
        {"type": "DELETED", "object": {**POD, "metadata": {**POD["metadata"], "resourceVersion": "8"}}}
    )
    bookmark = msgspec.json.encode({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}})
    upsert = event_feed("Pod", added)
    assert isinstance(upsert, CacheObjects)
    assert [msgspec.json.decode(o) for o in upsert.objects] == [POD]
    assert event_feed("Pod", deleted) == CacheDeleted(
        key=CacheKey(kind="Pod", namespace="ns", name="web"), resource_version="8"
    )
    assert event_feed("Pod", bookmark) is None
    assert event_feed("Pod", b"{not json") is None


@given(st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=6), st.integers(1, 30))
def test_watch_lines_come_whole_however_the_body_is_cut(lines: list[bytes], cut: int) -> None:
    """Lines split at any byte boundaries come out whole, in order, without empty ones."""
    body = b"".join(line + b"\n" for line in lines)
    splitter = WatchLines()
    got: list[bytes] = []
    for start in range(0, len(body), cut):
        got += splitter.feed(body[start : start + cut])
    assert got == [line for line in lines if line.strip()]


def test_a_watch_line_past_the_limit_stops_the_feed() -> None:
    """A line longer than the limit stops feeding that watch instead of growing without bound."""
    splitter = WatchLines(limit=10)
    assert splitter.feed(b"x" * 11) == []
    assert splitter.overflowed
    assert splitter.feed(b"\n{}\n") == []


def test_paths_name_their_kind_and_watches_are_recognised() -> None:
    """Status subresources name their object, legacy watch paths and watch=true are watches."""
    target, sub = object_target(f"/api/v1/nodes/{NODE}/status")
    assert target is not None
    assert (target.resource.kind, target.name, sub) == ("Node", NODE, "status")
    watch_target, _ = object_target("/api/v1/watch/pods")
    assert wants_watch(watch_target, {})
    list_target, _ = object_target("/api/v1/pods")
    assert wants_watch(list_target, {"watch": ["true"]})
    assert not wants_watch(list_target, {})
    assert object_target("/api/v1/nodes/x/proxy") == (None, "")
