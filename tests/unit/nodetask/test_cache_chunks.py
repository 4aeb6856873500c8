"""A replace in chunks: any collection split under any frame limit is put together again exactly, and
a stream of its chunks that is not all of them in order never swaps a collection in."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from nodetask import cache_chunks
from nodetask.cache_chunks import Collection, Progress, Step
from nodetask.messages import CacheChunk, CacheKey, decode_downstream, encode

KIND = "Pod"


def key_of(obj: msgspec.Raw) -> CacheKey:
    meta = msgspec.json.decode(obj)["metadata"]
    return CacheKey(kind=KIND, namespace=meta["namespace"], name=meta["name"])


def to_raw(name: str, namespace: str, filler: str) -> msgspec.Raw:
    doc = {"metadata": {"name": name, "namespace": namespace}, "data": {"v": filler}}
    return msgspec.Raw(msgspec.json.encode(doc))


objects = st.lists(
    st.builds(
        to_raw,
        st.text("abcdefgh-", min_size=1, max_size=12),
        st.sampled_from(["default", "kube-system", "ns"]),
        # Quotes and non-ASCII grow once encoded: sizes are counted in bytes, as sent.
        st.text(st.sampled_from('xyz"\\\né'), max_size=400),
    ),
    max_size=40,
)
versions = st.sampled_from(["", "7", "123456789"])
replace_ids = st.sampled_from(["1", "42", "a-long-replace-id"])


def alone(obj: msgspec.Raw, n: int, replace: str, version: str) -> int:
    """The frame of ``obj`` alone in a chunk of a replace of ``n`` objects (the largest seq such a chunk has)."""
    return len(encode(CacheChunk(kind=KIND, replace=replace, seq=n, objects=(obj,), resource_version=version)))


@st.composite
def splits(draw: st.DrawFn) -> tuple[list[msgspec.Raw], str, str, int]:
    """A collection, its resourceVersion, a replace id, and a frame limit at least its largest object's frame."""
    found, version, replace = draw(objects), draw(versions), draw(replace_ids)
    smallest = max((alone(o, len(found), replace, version) for o in found), default=200)
    return found, version, replace, draw(st.integers(smallest, smallest + 3000))


def split(found: list[msgspec.Raw], version: str, replace: str, limit: int) -> tuple[CacheChunk, ...]:
    return cache_chunks.split(KIND, found, replace=replace, resource_version=version, limit=limit, key_of=key_of)


@given(splits())
def test_any_collection_split_under_a_limit_its_objects_fit_is_reassembled_exactly(
    case: tuple[list[msgspec.Raw], str, str, int],
) -> None:
    """Whatever the collection and the limit (at least its largest object's frame), every chunk's frame is
    within the limit, the last alone is marked last, and the chunks in order give the collection back."""
    found, version, replace, limit = case
    chunks = split(found, version, replace, limit)
    assert all(len(encode(chunk)) <= limit for chunk in chunks)
    assert [c.seq for c in chunks] == list(range(len(chunks)))
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert all(decode_downstream(encode(c)) == c for c in chunks)
    assert cache_chunks.reassemble(chunks) == [Collection(KIND, tuple(found), version, ())]


@given(objects, versions, st.integers(200, 3000))
def test_objects_too_large_for_any_frame_are_named_instead_and_the_rest_reassembled(
    found: list[msgspec.Raw], version: str, limit: int
) -> None:
    """Under any limit, objects whose frame alone would be over it are left out and named as kept, the
    others reassembled in order, and no frame is over the limit."""
    chunks = split(found, version, "1", limit)
    assert all(len(encode(chunk)) <= limit for chunk in chunks)
    fits = [o for o in found if alone(o, len(found), "1", version) <= limit]
    too_large = tuple(key_of(o) for o in found if alone(o, len(found), "1", version) > limit)
    assert cache_chunks.reassemble(chunks) == [Collection(KIND, tuple(fits), version, too_large)]


def test_a_limit_that_cannot_even_name_an_object_is_refused() -> None:
    """A frame limit under what a chunk naming one object needs is a ValueError naming the object."""
    with pytest.raises(ValueError, match="cannot name the Pod ns/big"):
        split([to_raw("big", "ns", "x" * 500)], "1", "1", 150)


def mutations(n: int) -> st.SearchStrategy[list[int]]:
    """Orders of a split's ``n`` chunks that are not all of them in order: one missing, one repeated before
    the last has come, two swapped, or any sequence at all."""
    positions = st.integers(0, n - 1)
    missing = positions.map(lambda i: [j for j in range(n) if j != i])
    repeated = (
        st.integers(0, n - 1)
        .flatmap(lambda i: st.integers(i + 1, n).map(lambda at: [*range(at), i, *range(at, n)]))
        .filter(lambda order: order[:n] != list(range(n)))
    )
    swapped = st.tuples(positions, positions).filter(lambda ij: ij[0] != ij[1]).map(lambda ij: _swap(n, *ij))
    anything = st.lists(positions, max_size=2 * n + 2)
    return st.one_of(missing, repeated, swapped, anything) if n > 1 else st.one_of(missing, anything)


def _swap(n: int, i: int, j: int) -> list[int]:
    order = list(range(n))
    order[i], order[j] = order[j], order[i]
    return order


@given(st.data(), splits())
def test_chunks_missing_repeated_or_out_of_order_never_commit(
    data: st.DataObject, case: tuple[list[msgspec.Raw], str, str, int]
) -> None:
    """A stream of a replace's chunks commits the collection exactly when it begins with every chunk in
    order (once, whatever follows), and nothing otherwise: a chunk missing, repeated before the last or
    out of order gives the replace up for good."""
    found, version, replace, limit = case
    chunks = split(found, version, replace, limit)
    order = data.draw(mutations(len(chunks)))
    stream = [chunks[i] for i in order]
    expected = [Collection(KIND, tuple(found), version, ())] if order[: len(chunks)] == list(range(len(chunks))) else []
    assert cache_chunks.reassemble(stream) == expected


@given(splits(), splits(), st.data())
def test_a_replace_begun_anew_takes_the_place_of_one_cut_short(
    first: tuple[list[msgspec.Raw], str, str, int], second: tuple[list[msgspec.Raw], str, str, int], data: Any
) -> None:
    """Chunks of a replace cut short, then all of a new one (another id): only the new one is committed."""
    assume(first[2] != second[2])
    new = split(second[0], second[1], second[2], second[3])
    cut = split(first[0], first[1], first[2], first[3])
    kept = data.draw(st.integers(0, len(cut) - 1))
    assert cache_chunks.reassemble([*cut[:kept], *new]) == [Collection(KIND, tuple(second[0]), second[1], ())]


def test_each_kind_has_its_own_replace_under_way() -> None:
    """Chunks of two kinds interleaved are two replaces, each committed by its own last chunk."""
    pods = split([to_raw(f"p{i}", "ns", "x" * 100) for i in range(6)], "5", "1", 400)
    maps = cache_chunks.split(
        "ConfigMap", [to_raw("c", "ns", "y" * 300)] * 3, replace="1", resource_version="6", limit=500, key_of=key_of
    )
    assert len(pods) > 2
    assert len(maps) > 1
    stream = [pods[0], maps[0], pods[1], maps[1], *pods[2:], *maps[2:]]
    assert [(c.kind, len(c.objects)) for c in cache_chunks.reassemble(stream)] == [("Pod", 6), ("ConfigMap", 3)]


def test_step_goes_on_only_from_the_chunk_before() -> None:
    """The edge's rule, chunk by chunk: a new id at seq 0 begins, the next seq goes on, the last commits,
    and anything after it of the same replace is dropped."""
    a0, a1, a2 = (CacheChunk(kind=KIND, replace="a", seq=i, last=i == 2) for i in range(3))
    progress, verdict = cache_chunks.step(None, a0)
    assert (progress, verdict) == (Progress("a", 1, open=True), Step.STAGE)
    progress, verdict = cache_chunks.step(progress, a1)
    assert (progress, verdict) == (Progress("a", 2, open=True), Step.STAGE)
    progress, verdict = cache_chunks.step(progress, a2)
    assert (progress, verdict) == (Progress("a", 3, open=False), Step.COMMIT)
    assert cache_chunks.step(progress, a0) == (Progress("a", 3, open=False), Step.DROP)
    assert cache_chunks.step(None, a1) == (Progress("a", 0, open=False), Step.DROP)
