"""The base of every wire message between hubs and edges, and the error a frame that is none raises.

Kept apart so that the rooms of messages (:mod:`nodetask.cache_messages`, :mod:`nodetask.relay_messages`)
and :mod:`nodetask.messages`, which gathers them into each direction's union and codec, share it.
"""

from __future__ import annotations

import msgspec

__all__ = ["Message", "MessageError"]


class MessageError(ValueError):
    """A frame that is not a valid message; the text says what is wrong and where."""


class Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="op", rename="camel"):
    """Base of all wire messages."""
