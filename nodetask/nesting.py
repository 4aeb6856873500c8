"""Refuse deeply nested JSON and YAML before a recursive decoder sees it.

msgspec, the stdlib ``json`` and PyYAML's composer all recurse once per level of nesting. msgspec
and ``json`` raise ``RecursionError`` somewhere under Python's recursion limit (later than the
handler that called them expects, so it escapes it and can end the process), and libyaml's composer,
which ``msgspec.yaml`` uses, recurses in C and overflows the stack: a deeply nested YAML file
crashes the interpreter with a segfault. Real inputs nest under twenty levels (a job manifest with
its managed fields inside an AdmissionReview), so every decoder of outside input refuses more than
:data:`MAX_DEPTH` levels first, with a :class:`NestingError` naming the limit.

:func:`check_json` costs two ``count`` calls for a frame with few brackets (the hub's hot path);
only a document with more than the limit's number of brackets is scanned, at C speed throughout.
:func:`load_yaml` is PyYAML's pure-Python safe loader with a composer that counts levels.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

if TYPE_CHECKING:
    import yaml

__all__ = [
    "MAX_DEPTH",
    "AliasingError",
    "DuplicateKeyError",
    "NestingError",
    "allowed_alias_ratio",
    "check_json",
    "load_yaml",
]

MAX_DEPTH: Final = 64
"""Levels of arrays and objects (YAML sequences and mappings) any decoder of outside input accepts."""


class NestingError(msgspec.DecodeError):
    """A document nests deeper than the limit; the message names the limit (and, for YAML, the line).

    A :class:`msgspec.DecodeError`, so every caller that already turns a malformed document into a
    clear refusal does the same with this one.
    """


def _too_deep(limit: int, where: str = "") -> NestingError:
    return NestingError(f"nested too deeply: more than {limit} levels of arrays and objects{where}")


class AliasingError(msgspec.DecodeError):
    """A YAML document whose aliases would expand it far beyond its own size ("billion laughs")."""


class DuplicateKeyError(msgspec.DecodeError):
    """A YAML mapping that gives a key twice; the message names the key and both lines."""


def allowed_alias_ratio(decoded: int) -> float:
    """The share of a document's nodes that may come from aliases once ``decoded`` nodes are decoded.

    go-yaml's rule, which kubectl and the API server apply to the same manifests: 99% up to 400,000
    nodes, falling linearly to 10% at 4,000,000; a document of at most 1,000 nodes is never refused.
    """
    low, high = 400_000, 4_000_000
    if decoded <= low:
        return 0.99
    if decoded >= high:
        return 0.10
    return 0.99 - 0.89 * (decoded - low) / (high - low)


# After escapes are gone and everything but quotes and brackets is deleted, a string with brackets in
# it, from its opening quote to its closing one, or to the end when it is not closed (a decoder reads an
# unclosed string to the end and fails, never nesting inside it).
_STRING: Final = re.compile(rb'"[^"]*"?')
_KEPT: Final = b'[]{}"'
_NOT_KEPT: Final = bytes(sorted(set(range(256)) - set(_KEPT)))
_PARENS: Final = bytes.maketrans(b"[]{}", b"()()")


def check_json(document: bytes | str, *, limit: int = MAX_DEPTH) -> None:
    """Raise :class:`NestingError` if ``document``'s arrays and objects nest more than ``limit`` deep.

    Brackets inside strings do not count. The depth is counted as a decoder reading from the start
    would meet it, whether or not the document is valid JSON: a stray closing bracket at the top
    closes nothing, an unclosed string hides the rest. A document this accepts is no deeper than
    ``limit`` for any decoder; whether it is valid JSON is the decoder's to say.
    """
    if isinstance(document, str):
        if document.count("[") + document.count("{") <= limit:
            return
        # Surrogates pass: a str may hold lone ones, and brackets are ASCII in any case.
        document = document.encode("utf-8", "surrogatepass")
    elif document.count(b"[") + document.count(b"{") <= limit:
        return
    if b"\\" in document:
        # Escaped backslashes first, pairing each run of backslashes from its left as a decoder does;
        # then every quote still preceded by a backslash is escaped. Outside strings a backslash is
        # already an error at which a decoder stops, so what this does after one does not matter.
        document = document.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Two quotes in a row enclose nothing to count (an empty string, or no structure between two
    # strings): without them, what quotes remain enclose strings that hold brackets, rare in practice.
    structure = document.translate(_PARENS, _NOT_KEPT).replace(b'""', b"")
    if b'"' in structure:
        structure = _STRING.sub(b"", structure)
    if structure.count(b"(") <= limit:
        return
    # A round removes every innermost pair: it lowers the deepest level by one at most (exactly one in
    # a well-formed document) and leaves the depth of what remains as it was. Rounds pay while runs
    # of brackets are short, as in most documents (which they empty), and then the runs are scanned.
    rounds = 0
    while rounds < limit and structure.count(b")(") * _SHORT_RUN > len(structure):
        structure, rounds = structure.replace(b"()", b""), rounds + 1
    if rounds + _deepest(structure) > limit:
        raise _too_deep(limit)


_SHORT_RUN: Final = 16
"""Brackets per opening run below which a round of removing pairs is cheaper than scanning the runs
(a round and the scan cost a few nanoseconds a byte, the scan about a hundred more a run)."""


def _deepest(structure: bytes) -> int:
    """The most brackets open at once in ``structure`` (only ``(`` and ``)``), counting from 0."""
    # Split where a closing run meets an opening one: each part is "(((...)))", the first one
    # possibly without openings, the last one possibly without closings.
    parts = structure.replace(b")(", b") (").split(b" ")
    opened = list(map(bytes.count, parts, itertools.repeat(b"(")))
    closed = map(operator.sub, map(len, parts), opened)
    return max(map(operator.sub, itertools.accumulate(opened), itertools.accumulate(closed, initial=0)), default=0)


def load_yaml(document: bytes | str, *, limit: int = MAX_DEPTH, unique_keys: bool = False) -> Any:
    """``document`` as plain Python data, like ``msgspec.yaml.decode`` without a type.

    Errors: :class:`msgspec.DecodeError` for YAML that does not parse; :class:`NestingError` for
    sequences and mappings nested more than ``limit`` deep, counting what aliases bring in, and for
    an alias inside the node it names (an endless nesting); :class:`AliasingError` for aliases that
    would make the data far larger than the document (:func:`allowed_alias_ratio`): PyYAML shares
    an aliased node, but whatever walks the data afterwards (a conversion, an encoder) expands it.
    With ``unique_keys``, :class:`DuplicateKeyError` for a mapping that gives a key twice: PyYAML
    keeps the last value silently, so a setting written twice in a file would lose its first one
    without a word (merge keys, ``<<``, still override as YAML means them to).
    """
    import yaml  # noqa: PLC0415  (loaded on first use: an idle edge agent does without it)

    loader = _loader_class(unique_keys=unique_keys)(document, limit)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise msgspec.DecodeError(str(exc)) from None
    finally:
        loader.dispose()


class _Loader(Protocol):
    def get_single_data(self) -> Any: ...
    def dispose(self) -> None: ...


def _at(event: yaml.Event) -> str:
    mark = event.start_mark
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


@functools.cache
def _loader_class(*, unique_keys: bool) -> Callable[[bytes | str, int], _Loader]:
    import yaml  # noqa: PLC0415

    class DepthLimitedLoader(yaml.SafeLoader):
        # PyYAML's parser and scanner keep their own stacks; only the composer recurses, once per
        # level, so it is where the levels are counted. The safe constructor then builds the nodes
        # with generators, not recursion.
        def __init__(self, stream: bytes | str, limit: int) -> None:
            super().__init__(stream)
            self.limit = limit
            self._levels: list[int] = []
            """For each collection being composed, the most levels among its children so far."""
            self._anchored: dict[str, tuple[int, int]] = {}
            """The levels and the expanded size (in nodes) of each anchored node composed so far, which an
            alias to it brings in."""
            self._sizes: list[int] = []
            """For each collection being composed, the expanded size of its children so far."""
            self._decoded = 0
            """Nodes the data will have, counting each alias as the nodes it brings in."""
            self._aliased = 0
            """Of those, the nodes aliases bring in."""

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            event: yaml.NodeEvent = self.peek_event()  # type: ignore[no-untyped-call]  # untyped in the stubs
            if isinstance(event, yaml.AliasEvent):
                node = super().compose_node(parent, index)  # refuses an undefined alias
                anchored = self._anchored.get(event.anchor or "")
                if anchored is None:  # its node is still being composed: the alias is inside it
                    raise NestingError(f"the alias *{event.anchor}{_at(event)} is inside the node it names")
                levels, size = anchored
                if len(self._levels) + levels > self.limit:
                    raise _too_deep(self.limit, _at(event))
                self._decoded += size
                self._aliased += size
                if self._decoded > 1000 and self._aliased / self._decoded > allowed_alias_ratio(self._decoded):
                    raise AliasingError(
                        f"the document contains excessive aliasing: the alias *{event.anchor}{_at(event)} brings"
                        f" its data to {self._decoded} nodes, {self._aliased} of them through aliases"
                    )
            else:
                collection = isinstance(event, yaml.CollectionStartEvent)
                if collection:
                    if len(self._levels) >= self.limit:
                        raise _too_deep(self.limit, _at(event))
                    self._levels.append(0)
                    self._sizes.append(0)
                self._decoded += 1
                node = super().compose_node(parent, index)
                levels = self._levels.pop() + 1 if collection else 0
                size = self._sizes.pop() + 1 if collection else 1
                if event.anchor is not None:
                    self._anchored[event.anchor] = (levels, size)
            if self._levels:
                self._levels[-1] = max(self._levels[-1], levels)
                self._sizes[-1] += size
            return node

    if not unique_keys:
        return DepthLimitedLoader

    class UniqueKeyLoader(DepthLimitedLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
            # Checked before the safe constructor flattens merge keys into the node: only keys written
            # in this mapping itself count.
            first: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    seen = first.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the constructor refuses it, saying so
                    continue
                if seen is not key_node:
                    raise DuplicateKeyError(
                        f"duplicate key {key!r} at line {key_node.start_mark.line + 1}"
                        f" (first given at line {seen.start_mark.line + 1}): a key may appear once in a mapping"
                    )
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader
