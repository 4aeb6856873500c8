"""The hub's index of what its cache sessions' nodes may see, fed by one shared watch per kind.

For each connected cache session (a :class:`~roles.cloud.cache.feed.Feed`) the index knows its
node's Pods (resourceVersion and references: not the Pods themselves, which go straight from the
watch or a list to the edge), and the ConfigMaps and Secrets those Pods reference, which it holds
whole once for every node that references them (:mod:`~roles.cloud.cache.references`). Objects of
nodes without a session are not kept; a node whose session starts is filled by lists of its own
objects (see :mod:`~roles.cloud.cache.streams`), so a hub holds what its own sessions need, however
large the cluster and however many hubs share the fleet.

Consistency: every watch event and list carries its resourceVersion; an object is only ever
replaced by a newer one. A list for one node is made at least as recent as everything the shared
watch has delivered (:meth:`CacheIndex.position`), and the watch events met while it is under way
are replayed on it, so no change falls between the list and the watch.

Nothing here waits: a change is turned into frames for the affected sessions (``Feed.push``) in the
watch's own task.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec
import structlog

from nodetask.autonomy import autonomy_request
from nodetask.messages import Autonomy, CacheDeleted, CacheObjects
from nodetask.pod_references import NONE, PodReferences, pod_references
from roles.cloud.cache.feed import BITS, Feed, PodEntry
from roles.cloud.cache.objects import NODE, POD, SECRET, Key, cache_key, head, pod_spec, version, wire
from roles.cloud.cache.references import REFERENCED, Fill, Held, ReferencedObjects
from roles.kube import Deleted, Relisted, Upserted, WatchEvent
from schemas.core import ObjectHead, RawObject

__all__ = ["Answer", "CacheIndex"]

Log = structlog.typing.FilteringBoundLogger


@dataclass(frozen=True, slots=True)
class Answer:
    """How to answer a CacheFetch of one key: ``send`` it, say it is ``gone``, ``read`` it from the API
    server first (a Node or Pod the node may see), or nothing yet (``pending``: its collection follows)."""

    verdict: str
    raw: msgspec.Raw | None = None
    rv: int = 0


GONE_HELD: Final = Held(None, 0)
PENDING: Final = Answer("pending")
GONE: Final = Answer("gone")
READ: Final = Answer("read")


class CacheIndex:
    """The shared index. ``want`` is called for a referenced object the hub does not hold yet,
    ``refill`` when a list of a node's Node or Pods under way was overtaken by a relist of the watch."""

    def __init__(self, *, want: Callable[[Key], None], refill: Callable[[Feed, str], None], log: Log) -> None:
        self.feeds: dict[str, Feed] = {}
        self._refill = refill
        self._log = log
        self._pod_nodes: dict[tuple[str, str], str] = {}
        """Every Pod some feed holds, and whose."""
        self._positions: dict[str, int] = {}
        self.objects = ReferencedObjects(feeds=self.feeds, positions=self._positions, want=want)
        """The ConfigMaps and Secrets the nodes' Pods reference."""
        self._shared_refs: weakref.WeakValueDictionary[PodReferences, PodReferences] = weakref.WeakValueDictionary()
        """One instance of each distinct set of references (most Pods of a workload share theirs)."""

    # ------------------------------------------------------------------------------------ sessions

    def attach(self, feed: Feed) -> None:
        """Start indexing ``feed``'s node (a session that replaces another takes its place)."""
        old = self.feeds.get(feed.node)
        if old is not None:
            self.detach(old)
        self.feeds[feed.node] = feed

    def detach(self, feed: Feed) -> None:
        """Stop indexing ``feed``'s node, unless a newer session holds it; drop what no one references."""
        if self.feeds.get(feed.node) is not feed:
            return
        del self.feeds[feed.node]
        for key in feed.pods:
            if self._pod_nodes.get(key) == feed.node:
                del self._pod_nodes[key]
        for ref in feed.refs:
            self.objects.unreference(ref, feed.node)
        feed.pods, feed.refs = {}, {}
        feed.stop()

    def position(self, kind: str) -> str:
        """The newest resourceVersion of an object the shared watch of ``kind`` has delivered ("0": none yet).

        A list at least this recent reflects every event the watch has delivered, and the API server's
        watch cache of the kind has already seen it, so it answers at once.
        """
        return str(self._positions.get(kind, 0))

    # --------------------------------------------------------------------------------- the watches

    def apply(self, kind: str, event: WatchEvent) -> None:
        """One event of ``kind``'s shared watch."""
        match event:
            case Upserted(obj=obj) | Deleted(obj=obj):
                deleted = isinstance(event, Deleted)
                rv = head(obj).rv
                self._positions[kind] = max(self._positions.get(kind, 0), rv)
                if kind == NODE:
                    self._node_event(obj, deleted)
                elif kind == POD:
                    self._pod_event(obj, deleted)
                else:
                    self.objects.event(kind, obj, deleted)
            case Relisted(objects=heads, resource_version=text):
                # The snapshot holds heads only (ObjectHead): whatever changed is listed again.
                rv = version(text)
                versions = [(h, version(h.metadata.resource_version)) for h in heads]
                # Not the list's own version: an etcd revision the API server's watch cache of this kind
                # may never reach (it moves with this kind's changes only), and a list asked to be at
                # least that recent would wait for it and fail.
                newest = max((v for _, v in versions), default=0)
                self._positions[kind] = max(self._positions.get(kind, 0), newest)
                if kind == NODE:
                    self._nodes_relisted(versions, rv)
                elif kind == POD:
                    self._pods_relisted(versions, rv)
                else:
                    self.objects.relisted(kind, versions, rv)
            case _:
                pass  # Invalid objects cannot be cached; an interruption ends in a Relisted.

    # ------------------------------------------------------------------------------------- Nodes

    def _node_event(self, obj: RawObject, deleted: bool) -> None:
        h = head(obj)
        feed = self.feeds.get(h.name)
        if feed is None:
            return
        if feed.filling is not None and NODE in feed.filling:
            feed.filling[NODE].append((obj, deleted))
        elif feed.has(NODE) and h.rv > feed.node_rv:
            feed.node_rv = h.rv
            if deleted:
                feed.push(CacheDeleted(key=cache_key((NODE, "", h.name)), resource_version=str(h.rv)))
                return
            self._tell_autonomy(feed, h.annotations)
            feed.push(CacheObjects(kind=NODE, objects=(wire(obj, NODE),)))

    def _nodes_relisted(self, heads: list[tuple[ObjectHead, int]], rv: int) -> None:
        listed = {h.metadata.name: v for h, v in heads if h.metadata.name in self.feeds}
        for feed in list(self.feeds.values()):
            if feed.filling is not None and NODE in feed.filling:
                self._overtaken(feed, NODE)
                continue
            if not feed.has(NODE):
                continue
            found = listed.get(feed.node)
            if found is None and feed.node_rv <= rv:
                feed.node_rv = rv
                feed.push(CacheDeleted(key=cache_key((NODE, "", feed.node)), resource_version=str(rv)))
            elif found is not None and found > feed.node_rv:
                self._resend(feed, NODE)

    def _tell_autonomy(self, feed: Feed, annotations: dict[str, str]) -> None:
        request = autonomy_request(annotations)
        if request.requested == feed.requested:
            return
        if request.problem:
            feed.log.warning("autonomy_annotation_invalid", error=request.problem)
        if feed.push(Autonomy(requested=request.requested)):
            feed.requested = request.requested

    # -------------------------------------------------------------------------------------- Pods

    def _pod_event(self, obj: RawObject, deleted: bool) -> None:
        h = head(obj)
        spec = pod_spec(obj)
        key = (h.namespace, h.name)
        bound = spec.node_name
        old = self._pod_nodes.get(key)
        if old is not None and (deleted or old != bound):
            self._pod_gone(self.feeds[old], key, h.rv, obj)  # a mapped Pod's node has a feed (see detach)
        feed = self.feeds.get(bound) if bound else None
        if feed is None:
            return
        if feed.filling is not None and POD in feed.filling:
            if not (deleted and old == bound):  # else _pod_gone kept it already
                feed.filling[POD].append((obj, deleted))
            return
        if deleted or not feed.has(POD):
            return
        entry = feed.pods.get(key)
        if h.rv <= (feed.pod_floor if entry is None else entry.rv):
            return
        refs = self._share(pod_references(spec))
        feed.pods[key] = PodEntry(h.rv, refs)
        self._pod_nodes[key] = bound
        self.objects.rereference(feed, NONE if entry is None else entry.refs, refs, h.namespace)
        feed.push(CacheObjects(kind=POD, objects=(wire(obj, POD),)))

    def _share(self, refs: PodReferences) -> PodReferences:
        shared: PodReferences = self._shared_refs.setdefault(refs, refs)
        return shared

    def _pod_gone(self, feed: Feed, key: tuple[str, str], rv: int, obj: RawObject | None = None) -> None:
        """A Pod ``feed``'s node held was deleted (at ``rv``) or is bound elsewhere now (``obj``)."""
        if feed.filling is not None and POD in feed.filling:
            if obj is not None:
                feed.filling[POD].append((obj, True))  # its list may still hold it
            return
        entry = feed.pods.get(key)
        if entry is None or rv <= entry.rv:
            return
        del feed.pods[key]
        if self._pod_nodes.get(key) == feed.node:
            del self._pod_nodes[key]
        if feed.has(POD):
            feed.push(CacheDeleted(key=cache_key((POD, *key)), resource_version=str(rv)))
        self.objects.rereference(feed, entry.refs, NONE, key[0])

    def _pods_relisted(self, heads: list[tuple[ObjectHead, int]], rv: int) -> None:
        current: dict[str, dict[tuple[str, str], int]] = {}
        for h, v in heads:
            if h.spec.node_name in self.feeds:
                current.setdefault(h.spec.node_name, {})[(h.metadata.namespace, h.metadata.name)] = v
        for feed in list(self.feeds.values()):
            if feed.filling is not None and POD in feed.filling:
                self._overtaken(feed, POD)
            elif feed.has(POD):
                if current.get(feed.node, {}) != {key: entry.rv for key, entry in feed.pods.items()}:
                    self._resend(feed, POD)
                else:
                    feed.pod_floor = max(feed.pod_floor, rv)

    def _resend(self, feed: Feed, kind: str) -> None:
        """What ``feed``'s node has of ``kind`` changed unseen (a relist of the watch says so): list it again."""
        feed.sent &= ~BITS[kind]
        self._refill(feed, kind)

    # ------------------------------------------------------------------------------------- fills

    def needs_fill(self, feed: Feed, kind: str) -> bool:
        """Whether ``feed``'s node should be listed for ``kind``: attached, not sent it, no list under way."""
        filling = feed.filling is not None and kind in feed.filling
        return self.feeds.get(feed.node) is feed and not feed.has(kind) and not filling

    def begin_fill(self, feed: Feed, kind: str) -> tuple[str, Fill]:
        """A list of ``feed``'s ``kind`` (Node or Pod) starts: the version to list at, and its token.

        The watch events of ``kind`` for the node are kept meanwhile, to be replayed on the list.
        """
        token: Fill = []
        if feed.filling is None:
            feed.filling = {}
        feed.filling[kind] = token
        return self.position(kind), token

    def end_fill(self, feed: Feed, kind: str, token: Fill, objects: list[RawObject], list_rv: str) -> bool:
        """The list begun with ``token`` returned ``objects`` as of ``list_rv``: send the collection.

        False if it is stale (the session ended or started over, or a relist overtook it): nothing done.
        """
        if self.feeds.get(feed.node) is not feed or feed.filling is None or feed.filling.get(kind) is not token:
            return False
        self._stop_filling(feed, kind)
        listed = version(list_rv)
        if kind == NODE:
            self._fill_node(feed, objects, token, listed)
        else:
            self._fill_pods(feed, objects, token, listed)
        feed.failures = 0
        return True

    def fail_fill(self, feed: Feed, kind: str, token: Fill) -> None:
        """The list begun with ``token`` failed: the node's ``kind`` stays unsent until a retry."""
        if feed.filling is not None and feed.filling.get(kind) is token:
            self._stop_filling(feed, kind)
            feed.failures += 1

    def _overtaken(self, feed: Feed, kind: str) -> None:
        """A relist of the shared watch may be newer than the list under way: that list is stale."""
        self._stop_filling(feed, kind)
        self._refill(feed, kind)

    @staticmethod
    def _stop_filling(feed: Feed, kind: str) -> None:
        if feed.filling is not None:
            feed.filling.pop(kind, None)
            if not feed.filling:
                feed.filling = None

    def _fill_node(self, feed: Feed, objects: list[RawObject], events: Fill, listed: int) -> None:
        obj = next((o for o in objects if head(o).name == feed.node), None)
        newest = listed
        for event, deleted in events:
            rv = head(event).rv
            if rv > newest:
                obj, newest = (None if deleted else event), rv
        feed.node_rv = newest
        self._tell_autonomy(feed, {} if obj is None else head(obj).annotations)
        feed.push_collection(NODE, [] if obj is None else [wire(obj, NODE)], newest)

    def _fill_pods(self, feed: Feed, objects: list[RawObject], events: Fill, listed: int) -> None:
        state: dict[tuple[str, str], RawObject | None] = {}
        versions: dict[tuple[str, str], int] = {}
        for obj in objects:
            h = head(obj)
            state[(h.namespace, h.name)] = obj
            versions[(h.namespace, h.name)] = h.rv
        newest = listed
        for obj, deleted in events:
            h = head(obj)
            key = (h.namespace, h.name)
            if h.rv <= max(listed, versions.get(key, 0)):
                continue
            gone = deleted or pod_spec(obj).node_name != feed.node
            state[key], versions[key], newest = (None if gone else obj), h.rv, max(newest, h.rv)
        old = feed.pods
        feed.pods = {}
        frames = []
        for key, pod in state.items():
            if pod is None or pod_spec(pod).node_name != feed.node:
                continue
            refs = self._share(pod_references(pod_spec(pod)))
            feed.pods[key] = PodEntry(versions[key], refs)
            self._pod_nodes[key] = feed.node
            self.objects.rereference(feed, NONE, refs, key[0])
            frames.append(wire(pod, POD))
        for key, entry in old.items():
            self.objects.rereference(feed, entry.refs, NONE, key[0])
            if key not in feed.pods and self._pod_nodes.get(key) == feed.node:
                del self._pod_nodes[key]
        feed.pod_floor = listed
        feed.push_collection(POD, frames, newest)
        self.objects.settle(feed)

    # ----------------------------------------------------------------------------------- fetches

    def answer(self, feed: Feed, kind: str, namespace: str, name: str) -> Answer:
        """How to answer ``feed``'s edge asking for one object again; never an object it may not see."""
        if kind == NODE:
            own = not namespace and name == feed.node
            return (READ if feed.has(NODE) else PENDING) if own else GONE
        if kind not in (POD, *REFERENCED) or (kind == SECRET and not feed.secrets):
            return GONE
        if not feed.has(POD):
            return PENDING  # which Pods and references are the node's is not known yet
        if kind == POD:
            return READ if (namespace, name) in feed.pods else GONE
        ref = (kind, namespace, name)
        held = self.objects.get(ref) if ref in feed.refs else GONE_HELD
        if held is None or not feed.has(kind):
            return PENDING
        return GONE if held.raw is None else Answer("send", held.raw, held.rv)

    def may_see(self, feed: Feed, kind: str, obj: RawObject) -> bool:
        """Whether ``obj``, read again for a fetch, is still ``feed``'s node's to see (a Node or Pod)."""
        if kind == NODE:
            return head(obj).name == feed.node
        return pod_spec(obj).node_name == feed.node
