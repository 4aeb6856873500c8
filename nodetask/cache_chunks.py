"""A collection too large for one frame, sent as a replace in parts, and the edge's rule for taking them.

An edge swaps a kind's collection for the hub's list in one step (``CacheObjects`` with
``replace``), which needs the whole list in one frame, and the edge closes a session whose frame is
over its limit. A larger collection goes as :class:`~nodetask.messages.CacheChunk` frames, each
within the limit: one ``replace`` id on all of them, ``seq`` 0, 1, ... and ``last`` on the final
one. The edge stages the parts and swaps its collection only when the last one comes after every
one before it, in order; a part missing, repeated or out of place gives the replace up, and the
collection stays as it was. On one session a hub never sends them so, and whatever cuts a replace
short (the connection, an edge falling behind) is followed by a relist: a new replace, from seq 0.

:func:`split` is the hub's half; :func:`step` is the edge's decision for each chunk it receives
(the edge keeps the staged objects in its store); :func:`reassemble` is that rule with the staging
kept in memory, the contract both halves are held to.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from nodetask.messages import CacheChunk, CacheKey, encode

__all__ = ["Collection", "Progress", "Step", "reassemble", "split", "step"]

_ENCODER: Final = msgspec.json.Encoder()


def split(
    kind: str,
    objects: Sequence[msgspec.Raw],
    *,
    replace: str,
    resource_version: str,
    limit: int,
    key_of: Callable[[msgspec.Raw], CacheKey],
) -> tuple[CacheChunk, ...]:
    """``objects`` (the collection of ``kind`` as listed at ``resource_version``) as the chunks of the
    replace ``replace``, each of them at most ``limit`` bytes once encoded, in order.

    An object too large to go in any chunk is left out and named instead (``kept``, by ``key_of``),
    on the last chunk or the ones just before it. Errors: ``ValueError`` when ``limit`` is too small
    for a chunk holding one such name.
    """
    # Every chunk is sized with the largest envelope any of them can have (seq is below the number of
    # objects, and last=false is the longer), so that no chunk can come out over the limit.
    envelope = len(encode(CacheChunk(kind=kind, replace=replace, seq=len(objects), resource_version=resource_version)))
    room = limit - envelope
    items: list[tuple[msgspec.Raw | CacheKey, int]] = [(obj, len(obj)) for obj in objects if len(obj) <= room]
    for obj in objects:
        if len(obj) > room:
            key = key_of(obj)
            size = len(_ENCODER.encode(key))
            if size > room:
                raise ValueError(f"a frame limit of {limit} bytes cannot name the {kind} {key.namespace}/{key.name}")
            items.append((key, size))
    groups: list[tuple[list[msgspec.Raw], list[CacheKey]]] = [([], [])]
    used = 0
    for item, size in items:
        # Each item is counted with a comma, which the first of its list does not have: a chunk's
        # objects and names take less than ``used``, never more than ``room``.
        if used and used + size + 1 > room:
            groups.append(([], []))
            used = 0
        used += size + 1
        if isinstance(item, CacheKey):
            groups[-1][1].append(item)
        else:
            groups[-1][0].append(item)
    return tuple(
        CacheChunk(
            kind=kind,
            replace=replace,
            seq=seq,
            objects=tuple(parts),
            last=seq == len(groups) - 1,
            resource_version=resource_version,
            kept=tuple(kept),
        )
        for seq, (parts, kept) in enumerate(groups)
    )


class Step(enum.Enum):
    """What the edge does with a chunk (:func:`step`)."""

    STAGE = "stage"
    """Stage its objects: after those staged for its replace, or in their place when its seq is 0."""
    COMMIT = "commit"
    """The last chunk: the objects staged for its replace and its own are the collection."""
    DROP = "drop"
    """Out of place: its replace is given up, and what was staged for it discarded."""


@dataclass(frozen=True, slots=True)
class Progress:
    """Where the last replace of a kind the edge was sent stands."""

    replace: str
    next: int
    """The seq the next chunk must have."""
    open: bool
    """Whether it may go on: not yet committed nor given up."""


def step(progress: Progress | None, chunk: CacheChunk) -> tuple[Progress, Step]:
    """The edge's decision for ``chunk``, given where the last replace of its kind stands (None: none yet).

    A chunk goes on only from the one before it; a seq 0 with a new id begins a replace (whatever
    was under way is stale: the hub has started over). Anything else gives its replace up for good,
    so that no repeated or late chunk can make a collection out of parts that do not belong together.
    """
    if progress is None or chunk.replace != progress.replace:
        if chunk.seq != 0:
            return Progress(chunk.replace, 0, open=False), Step.DROP
        return Progress(chunk.replace, 1, open=not chunk.last), Step.COMMIT if chunk.last else Step.STAGE
    if not progress.open or chunk.seq != progress.next:
        return Progress(progress.replace, progress.next, open=False), Step.DROP
    return Progress(chunk.replace, chunk.seq + 1, open=not chunk.last), Step.COMMIT if chunk.last else Step.STAGE


@dataclass(frozen=True, slots=True)
class Collection:
    """A replace put together: the collection of ``kind`` at ``resource_version``, and the objects ``kept``."""

    kind: str
    objects: tuple[msgspec.Raw, ...]
    resource_version: str
    kept: tuple[CacheKey, ...]


def reassemble(chunks: Iterable[CacheChunk]) -> list[Collection]:
    """The collections an edge taking ``chunks`` in this order would swap in, one per replace committed."""
    progress: dict[str, Progress] = {}
    staged: dict[str, tuple[list[msgspec.Raw], list[CacheKey]]] = {}
    done: list[Collection] = []
    for chunk in chunks:
        progress[chunk.kind], verdict = step(progress.get(chunk.kind), chunk)
        if verdict is Step.DROP:
            staged.pop(chunk.kind, None)
            continue
        objects, kept = ([], []) if chunk.seq == 0 else staged[chunk.kind]
        objects.extend(chunk.objects)
        kept.extend(chunk.kept)
        if verdict is Step.STAGE:
            staged[chunk.kind] = (objects, kept)
        else:
            staged.pop(chunk.kind, None)
            done.append(Collection(chunk.kind, tuple(objects), chunk.resource_version, tuple(kept)))
    return done
