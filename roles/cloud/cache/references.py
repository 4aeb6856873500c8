"""The ConfigMaps and Secrets the Pods of the hub's cache sessions' nodes reference, held once for all of them.

Each referenced object is held whole (its frame-ready JSON), with the nodes referencing it, for as long as
one does; one no node references is forgotten at once, with any list of it under way. An object not
held yet is asked for (``want``: the cache streams list it) and its watch events met meanwhile are
replayed on that list (:meth:`ReferencedObjects.begin_key`, :meth:`~ReferencedObjects.end_key`), so
that, as for Nodes and Pods, an object is only ever replaced by a newer one.

A node gets its ConfigMaps and Secrets collections once every object they hold is known
(:meth:`ReferencedObjects.settle`); after that each change of one it references, as it comes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import msgspec

from nodetask.messages import CacheDeleted, CacheObjects
from nodetask.pod_references import PodReferences
from roles.cloud.cache.feed import Feed
from roles.cloud.cache.objects import CONFIG_MAP, POD, SECRET, Key, cache_key, head, version, wire
from schemas.core import ObjectHead, RawObject

__all__ = ["REFERENCED", "Fill", "Held", "ReferencedObjects"]

REFERENCED: Final = (CONFIG_MAP, SECRET)
"""The kinds a Pod references."""

Fill = list[tuple[RawObject, bool]]
"""A list under way: the watch events met meanwhile, and by its identity the token of that list."""


@dataclass(frozen=True, slots=True)
class Held:
    """A referenced ConfigMap or Secret as last seen: its frame-ready JSON, or None when it does not exist."""

    raw: msgspec.Raw | None
    rv: int


class ReferencedObjects:
    """The referenced objects of the nodes in ``feeds`` (the index's, shared); ``positions`` are the
    newest versions the shared watches have delivered, by kind (the index's, shared); ``want`` is called
    for a referenced object not held yet."""

    def __init__(self, *, feeds: dict[str, Feed], positions: dict[str, int], want: Callable[[Key], None]) -> None:
        self._feeds = feeds
        self._positions = positions
        self._want = want
        self._referrers: dict[Key, set[str]] = {}
        """Referenced ConfigMaps and Secrets, and the nodes referencing each."""
        self._held: dict[Key, Held] = {}
        self._filling: dict[Key, Fill] = {}
        """Referenced objects being listed, with the watch events met meanwhile."""

    def get(self, ref: Key) -> Held | None:
        """``ref`` as held (None: not known yet)."""
        return self._held.get(ref)

    def held(self) -> dict[str, int]:
        """Referenced objects held, by kind (a metric)."""
        counts = dict.fromkeys(REFERENCED, 0)
        for (kind, _, _), held in self._held.items():
            if held.raw is not None:
                counts[kind] += 1
        return counts

    def referenced(self) -> int:
        """Referenced objects, held or not (a metric)."""
        return len(self._referrers)

    def rereference(self, feed: Feed, old: PodReferences, new: PodReferences, namespace: str) -> None:
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
            self.unreference(ref, feed.node)
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

    def unreference(self, ref: Key, node: str) -> None:
        """``node`` references ``ref`` no more."""
        nodes = self._referrers.get(ref)
        if nodes is None:
            return
        nodes.discard(node)
        if not nodes:
            # No session's node needs it any more: forget it, and any list of it under way.
            del self._referrers[ref]
            self._held.pop(ref, None)
            self._filling.pop(ref, None)

    def event(self, kind: str, obj: RawObject, deleted: bool) -> None:
        """One event of ``kind``'s shared watch."""
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
            feed = self._feeds[node]
            if not feed.has(kind):
                self.settle(feed)
            elif raw is not None:
                feed.push(CacheObjects(kind=kind, objects=(raw,)))
            elif held is not None and held.raw is not None:
                feed.push(CacheDeleted(key=cache_key(ref), resource_version=str(rv)))

    def relisted(self, kind: str, heads: list[tuple[ObjectHead, int]], rv: int) -> None:
        """``kind``'s shared watch listed again (``heads`` at ``rv``): what changed unseen is read again."""
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

    def settle(self, feed: Feed) -> None:
        """Send ``feed`` its ConfigMaps and Secrets collections once every object they hold is known."""
        if not feed.has(POD):
            return
        for kind in REFERENCED:
            if feed.has(kind) or (kind == SECRET and not feed.secrets):
                continue
            refs = [ref for ref in feed.refs if ref[0] == kind]
            if any(ref not in self._held for ref in refs):
                continue
            held = [self._held[ref] for ref in refs]
            newest = max([self._positions.get(kind, 0), *(h.rv for h in held)])
            feed.push_collection(kind, [h.raw for h in held if h.raw is not None], newest)

    def begin_key(self, ref: Key) -> tuple[str, Fill] | None:
        """A list of referenced ``ref`` starts: the version to list at and its token; None if not needed now."""
        if ref not in self._referrers or ref in self._held or ref in self._filling:
            return None
        token: Fill = []
        self._filling[ref] = token
        return str(self._positions.get(ref[0], 0)), token

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
