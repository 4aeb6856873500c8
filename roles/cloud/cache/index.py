"""The hub's index of what its cache sessions' nodes may see, fed by one shared watch per kind.

For each connected cache session (a :class:`~roles.cloud.cache.feed.Feed`) the index knows its
node's Pods (resourceVersion and references: not the Pods themselves, which go straight from the
watch or a list to the edge), and the ConfigMaps and Secrets those Pods reference, which it holds
whole once for every node that references them. Objects of nodes without a session are not kept;
a node whose session starts is filled by lists of its own objects (see
:mod:`~roles.cloud.cache.streams`), so a hub holds what its own sessions need, however large the
cluster and however many hubs share the fleet.

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
from roles.cloud.cache.objects import CONFIG_MAP, NODE, POD, SECRET, Key, cache_key, head, pod_spec, version, wire
from roles.kube import Deleted, Relisted, Upserted, WatchEvent
from schemas.core import ObjectHead, RawObject

__all__ = ["Answer", "CacheIndex", "Held"]

Log = structlog.typing.FilteringBoundLogger

_REFERENCED: Final = (CONFIG_MAP, SECRET)


@dataclass(frozen=True, slots=True)
class Held:
    """A referenced ConfigMap or Secret as last seen: its frame-ready JSON, or None when it does not exist."""

    raw: msgspec.Raw | None
    rv: int


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


Fill = list[tuple[RawObject, bool]]
"""A list under way: the watch events met meanwhile, and by its identity the token of that list."""


class CacheIndex:
    """The shared index. ``want`` is called for a referenced object the hub does not hold yet,
    ``refill`` when a list of a node's Node or Pods under way was overtaken by a relist of the watch."""

    def __init__(self, *, want: Callable[[Key], None], refill: Callable[[Feed, str], None], log: Log) -> None:
        self.feeds: dict[str, Feed] = {}
        self._want = want
        self._refill = refill
        self._log = log
        self._pod_nodes: dict[tuple[str, str], str] = {}
        """Every Pod some feed holds, and whose."""
        self._referrers: dict[Key, set[str]] = {}
        """Referenced ConfigMaps and Secrets, and the nodes referencing each."""
        self._held: dict[Key, Held] = {}
        self._filling: dict[Key, Fill] = {}
        """Referenced objects being listed, with the watch events met meanwhile."""
        self._positions: dict[str, int] = {}
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
            self._unreference(ref, feed.node)
        feed.pods, feed.refs = {}, {}
        feed.stop()

    def position(self, kind: str) -> str:
        """The newest resourceVersion of an object the shared watch of ``kind`` has delivered ("0": none yet).

        A list at least this recent reflects every event the watch has delivered, and the API server's
        watch cache of the kind has already seen it, so it answers at once.
        """
        return str(self._positions.get(kind, 0))

    def held(self) -> dict[str, int]:
        """Referenced objects held, by kind (a metric)."""
        counts = dict.fromkeys(_REFERENCED, 0)
        for (kind, _, _), held in self._held.items():
            if held.raw is not None:
                counts[kind] += 1
        return counts

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
                    self._object_event(kind, obj, deleted)
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
                    self._objects_relisted(kind, versions, rv)
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
        self._rereference(feed, NONE if entry is None else entry.refs, refs, h.namespace)
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
        self._rereference(feed, entry.refs, NONE, key[0])

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

    # ------------------------------------------------------------------ ConfigMaps and Secrets

    def _rereference(self, feed: Feed, old: PodReferences, new: PodReferences, namespace: str) -> None:
        """A Pod of ``feed``'s node now references ``new`` instead of ``old``."""
        if old == new:
            return
        before, after = set(old.keys()), set(new.keys())
        for kind, name in before - after:
            if kind == SECRET and not feed.secrets:
                continue
            ref = (kind, namespace, name)
            count = feed.refs[ref] - 1
            if count:
                feed.refs[ref] = count
                continue
            del feed.refs[ref]
            held = self._held.get(ref)
            if feed.has(kind) and held is not None and held.raw is not None:
                feed.push(CacheDeleted(key=cache_key(ref), resource_version=str(held.rv)))
            self._unreference(ref, feed.node)
        for kind, name in after - before:
            if kind == SECRET and not feed.secrets:
                continue
            ref = (kind, namespace, name)
            count = feed.refs.get(ref, 0)
            feed.refs[ref] = count + 1
            if count:
                continue
            self._referrers.setdefault(ref, set()).add(feed.node)
            held = self._held.get(ref)
            if held is None:
                if ref not in self._filling:
                    self._want(ref)
            elif held.raw is not None and feed.has(kind):
                feed.push(CacheObjects(kind=kind, objects=(held.raw,)))

    def _unreference(self, ref: Key, node: str) -> None:
        nodes = self._referrers.get(ref)
        if nodes is None:
            return
        nodes.discard(node)
        if not nodes:
            # No session's node needs it any more: forget it, and any list of it under way.
            del self._referrers[ref]
            self._held.pop(ref, None)
            self._filling.pop(ref, None)

    def _object_event(self, kind: str, obj: RawObject, deleted: bool) -> None:
        h = head(obj)
        ref = (kind, h.namespace, h.name)
        if ref not in self._referrers:
            return
        filling = self._filling.get(ref)
        if filling is not None:
            filling.append((obj, deleted))
            return
        self._store(ref, None if deleted else obj, h.rv)

    def _store(self, ref: Key, obj: RawObject | None, rv: int) -> None:
        """``ref`` is ``obj`` (None: does not exist) as of ``rv``; tell the nodes referencing it."""
        held = self._held.get(ref)
        if held is not None and rv <= held.rv:
            return
        kind = ref[0]
        raw = None if obj is None else wire(obj, kind)
        self._held[ref] = Held(raw, rv)
        for node in self._referrers.get(ref, ()):
            feed = self.feeds[node]
            if not feed.has(kind):
                self._settle(feed)
            elif raw is not None:
                feed.push(CacheObjects(kind=kind, objects=(raw,)))
            elif held is not None and held.raw is not None:
                feed.push(CacheDeleted(key=cache_key(ref), resource_version=str(rv)))

    def _objects_relisted(self, kind: str, heads: list[tuple[ObjectHead, int]], rv: int) -> None:
        listed: dict[Key, int] = {}
        for h, v in heads:
            ref = (kind, h.metadata.namespace, h.metadata.name)
            if ref in self._referrers:
                listed[ref] = v
        for ref in [r for r in self._referrers if r[0] == kind]:
            held = self._held.get(ref)
            if ref in self._filling:
                del self._filling[ref]  # that list may be older than this one
                self._want(ref)
            elif ref not in listed:
                self._store(ref, None, rv)
            elif held is not None and listed[ref] > held.rv:
                # Changed unseen: read it again (its nodes keep the old one until then).
                del self._held[ref]
                self._want(ref)

    def _settle(self, feed: Feed) -> None:
        """Send ``feed`` its ConfigMaps and Secrets collections once every object they hold is known."""
        if not feed.has(POD):
            return
        for kind in _REFERENCED:
            if feed.has(kind) or (kind == SECRET and not feed.secrets):
                continue
            refs = [ref for ref in feed.refs if ref[0] == kind]
            if any(ref not in self._held for ref in refs):
                continue
            held = [self._held[ref] for ref in refs]
            newest = max([self._positions.get(kind, 0), *(h.rv for h in held)])
            feed.push_collection(kind, [h.raw for h in held if h.raw is not None], newest)

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
            self._rereference(feed, NONE, refs, key[0])
            frames.append(wire(pod, POD))
        for key, entry in old.items():
            self._rereference(feed, entry.refs, NONE, key[0])
            if key not in feed.pods and self._pod_nodes.get(key) == feed.node:
                del self._pod_nodes[key]
        feed.pod_floor = listed
        feed.push_collection(POD, frames, newest)
        self._settle(feed)

    def begin_key(self, ref: Key) -> tuple[str, Fill] | None:
        """A list of referenced ``ref`` starts: the version to list at and its token; None if not needed now."""
        if ref not in self._referrers or ref in self._held or ref in self._filling:
            return None
        token: Fill = []
        self._filling[ref] = token
        return self.position(ref[0]), token

    def end_key(self, ref: Key, token: Fill, obj: RawObject | None, list_rv: str) -> None:
        """The list begun with ``token`` found ``obj`` (None: absent) as of ``list_rv``."""
        if self._filling.get(ref) is not token:
            return  # no longer referenced, or a relist overtook it
        events = self._filling.pop(ref)
        listed = version(list_rv)
        state, newest = obj, max(listed, 0 if obj is None else head(obj).rv)
        for event, deleted in events:
            rv = head(event).rv
            if rv > newest:
                state, newest = (None if deleted else event), rv
        self._store(ref, state, newest)

    def fail_key(self, ref: Key, token: Fill) -> bool:
        """The list begun with ``token`` failed; True if ``ref`` is still wanted (retry it)."""
        if self._filling.get(ref) is token:
            del self._filling[ref]
        return ref in self._referrers and ref not in self._held and ref not in self._filling

    # ----------------------------------------------------------------------------------- fetches

    def answer(self, feed: Feed, kind: str, namespace: str, name: str) -> Answer:
        """How to answer ``feed``'s edge asking for one object again; never an object it may not see."""
        if kind == NODE:
            own = not namespace and name == feed.node
            return (READ if feed.has(NODE) else PENDING) if own else GONE
        if kind not in (POD, *_REFERENCED) or (kind == SECRET and not feed.secrets):
            return GONE
        if not feed.has(POD):
            return PENDING  # which Pods and references are the node's is not known yet
        if kind == POD:
            return READ if (namespace, name) in feed.pods else GONE
        ref = (kind, namespace, name)
        held = self._held.get(ref) if ref in feed.refs else GONE_HELD
        if held is None or not feed.has(kind):
            return PENDING
        return GONE if held.raw is None else Answer("send", held.raw, held.rv)

    def may_see(self, feed: Feed, kind: str, obj: RawObject) -> bool:
        """Whether ``obj``, read again for a fetch, is still ``feed``'s node's to see (a Node or Pod)."""
        if kind == NODE:
            return head(obj).name == feed.node
        return pod_spec(obj).node_name == feed.node

    def referenced(self) -> int:
        """Referenced objects, held or not (a metric)."""
        return len(self._referrers)
