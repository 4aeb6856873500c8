"""Edge autonomy's messages (seed 003): the device's cache of its node's cloud objects, and its condition.

Both sides list :data:`CACHE_CAPABILITY` (Hello, Welcome) before any of these flow, so agents and hubs
from before them never receive a frame they cannot decode. :mod:`nodetask.messages` puts them in each
direction's union.
"""

from __future__ import annotations

from typing import Final

import msgspec

from nodetask.message_base import Message

__all__ = [
    "CACHE_CAPABILITY",
    "CACHE_CHUNKS_CAPABILITY",
    "CACHE_SECRETS_CAPABILITY",
    "Autonomy",
    "AutonomyCondition",
    "CacheChunk",
    "CacheDeleted",
    "CacheFetch",
    "CacheKey",
    "CacheObjects",
]

# --------------------------------------------------------------------------------------- cloud -> edge

# Edge autonomy (seed 003). Both sides list CACHE_CAPABILITY (Hello, Welcome) before any of these
# messages flow, so agents and hubs from before them never receive a frame they cannot decode.

CACHE_CAPABILITY: Final = "cache.v1"
"""The cache and autonomy messages below."""
CACHE_SECRETS_CAPABILITY: Final = "cache.secrets"
"""The edge keeps its node's Secrets (its config allows it); without it the hub never sends one."""
CACHE_CHUNKS_CAPABILITY: Final = "cache.chunks"
""":class:`CacheChunk`: a collection too large for one frame is sent as a replace in parts. Without it on
both sides such a collection goes object by object, as upserts (what the edge holds beyond them stays)."""


class CacheKey(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One cached object: its Kubernetes kind (``Node``, ``Pod``, ``ConfigMap``, ``Secret``) and name."""

    kind: str
    namespace: str = ""
    name: str


class CacheObjects(Message, frozen=True, tag="cache_objects"):
    """Objects of the edge's cache of its node's cloud state, as the API server serves them.

    Without ``replace`` each object is an upsert (an older ``resourceVersion`` than the cached one is
    ignored). With ``replace`` they are the whole collection of ``kind`` as listed at
    ``resource_version``: the edge swaps its collection for them in one step, and keeps its
    collection untouched when the hub could not list it (the hub then sends nothing). A collection
    too large for one frame goes as :class:`CacheChunk` parts to an edge listing
    :data:`CACHE_CHUNKS_CAPABILITY`.
    """

    kind: str
    objects: tuple[msgspec.Raw, ...] = ()
    replace: bool = False
    resource_version: str = ""


class CacheChunk(Message, frozen=True, tag="cache_chunk"):
    """One part of a replace too large for one frame (:mod:`nodetask.cache_chunks`): the collection of
    ``kind`` is the objects of every chunk of ``replace``, in ``seq`` order from 0 to the ``last`` one.

    The edge swaps its collection only once the last chunk has come with every one before it in
    order; a connection that ends before leaves the collection as it was.
    """

    kind: str
    replace: str
    """Names the replace: the same in each of its chunks, another for each replace of the session."""
    seq: int
    objects: tuple[msgspec.Raw, ...] = ()
    last: bool = False
    resource_version: str = ""
    """The collection's, as listed (the same in each chunk)."""
    kept: tuple[CacheKey, ...] = ()
    """Objects of the collection too large for any frame: the edge keeps what it holds of them."""


class CacheDeleted(Message, frozen=True, tag="cache_deleted"):
    """An object left the node's cache: deleted in the cloud, or no longer the node's to see."""

    key: CacheKey
    resource_version: str = ""


class Autonomy(Message, frozen=True, tag="autonomy"):
    """Whether the node asked for autonomy (its annotations), sent after Welcome and on every change."""

    requested: bool


# --------------------------------------------------------------------------------------- edge -> cloud


class CacheFetch(Message, frozen=True, tag="cache_fetch"):
    """Send these objects again: the edge's repair loop, for keys it failed to store. The hub answers
    each with :class:`CacheObjects` or, when the object is gone or not the node's, :class:`CacheDeleted`."""

    keys: tuple[CacheKey, ...]


class AutonomyCondition(Message, frozen=True, tag="autonomy_condition"):
    """The edge's ``Autonomy`` condition changed (``nodetask.autonomy.check``); the hub writes it on the Node."""

    status: str
    reason: str
    message: str = ""
