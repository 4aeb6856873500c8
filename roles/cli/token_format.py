"""What an edge token looks like: made by ``nodetaskd token create``, checked by ``nodetaskd edge join``.

An edge sends its token as ``Authorization: Bearer <token>``, so a token is an RFC 6750
``b64token``: letters, digits and ``-._~+/``, then ``=`` padding. ``token create`` makes 43 of the
URL-safe ones from 32 random bytes; a token made by hand (a Secret written with ``kubectl``) fits
too as long as it is one such line. Join checks a token file against this before copying it, so
that a file that is not a token (another file's secrets, a key, a log) is never installed and sent
to the hubs as one. Standard library only: the device's base install joins.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_TOKEN_CHARS", "MIN_TOKEN_CHARS", "TOKEN_BYTES", "token_problem"]

TOKEN_BYTES: Final = 32
"""Random bytes in a token ``token create`` makes (43 URL-safe characters)."""
MIN_TOKEN_CHARS: Final = 16
"""Shorter is not a token anyone should trust a node's identity to (16 characters: 96 bits at best)."""
MAX_TOKEN_CHARS: Final = 1024
"""Far above what ``token create`` makes, far below what an HTTP header may carry."""
_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")


def token_problem(text: str) -> str:
    """What keeps ``text`` (a token file's content, stripped) from being a token; empty if nothing."""
    if not text:
        return "is empty"
    if "\n" in text:
        return "holds more than one line"
    if not (MIN_TOKEN_CHARS <= len(text) <= MAX_TOKEN_CHARS):
        return f"holds {len(text)} characters, and a token has {MIN_TOKEN_CHARS} to {MAX_TOKEN_CHARS}"
    if not _B64TOKEN.fullmatch(text):
        return "holds characters a bearer token cannot (a token is letters, digits and -._~+/, then = padding)"
    return ""
