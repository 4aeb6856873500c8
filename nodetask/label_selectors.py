"""Kubernetes label selectors: parsed, validated and matched as the API server does.

The syntax, the order of the checks and every error message are those of the API server this
project pins (1.20.2, ``k8s.io/apimachinery/pkg/labels``), so that a client
talking to a device's local API gets the answers, and the refusals, it would get from the cloud.
The lexer and parser are a port of Go's rather than a grammar of their own for that reason: their
quirks (``in`` is a value inside parentheses, ``()`` means the empty value, a key alone means
"exists") are part of what clients rely on.

Pure: strings and mappings in, requirements, booleans or :class:`SelectorError` out.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from typing import Final

from nodetask.label_requirements import (
    Operator,
    Requirement,
    format_label_selector,
    go_int,
    labels_match,
    requirement_matches,
)

__all__ = [
    "Operator",
    "Requirement",
    "SelectorError",
    "format_label_selector",
    "go_quote",
    "labels_match",
    "new_requirement",
    "parse_label_selector",
    "requirement_matches",
]


class SelectorError(ValueError):
    """A selector the API server would refuse (400 Bad Request); the message is the API server's."""


# ------------------------------------------------------------------------------------- validation

_QUALIFIED_NAME_FMT: Final = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
_QUALIFIED_NAME: Final = re.compile(_QUALIFIED_NAME_FMT)
_QUALIFIED_NAME_MSG: Final = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
)
_LABEL_VALUE_FMT: Final = f"({_QUALIFIED_NAME_FMT})?"
_LABEL_VALUE: Final = re.compile(_LABEL_VALUE_FMT)
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.',"
    " and must start and end with an alphanumeric character"
)
_SUBDOMAIN_FMT: Final = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_SUBDOMAIN: Final = re.compile(_SUBDOMAIN_FMT)
_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.',"
    " and must start and end with an alphanumeric character"
)


def _regex_error(msg: str, fmt: str, *examples: str) -> str:
    # Go's validation.RegexError, double spaces included.
    shown = " or ".join(f"'{e}', " for e in examples)
    return f"{msg} (e.g. {shown}regex used for validation is '{fmt}')"


def _byte_len(text: str) -> int:
    # Go measures strings in bytes.
    return len(text.encode("utf-8", "surrogatepass"))


def _qualified_name_problems(value: str) -> list[str]:
    """``validation.IsQualifiedName``: a label key, ``[prefix/]name``."""
    parts = value.split("/")
    if len(parts) > 2:
        return [
            "a qualified name "
            + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
            + " with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        ]
    problems: list[str] = []
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            problems.append("prefix part must be non-empty")
        else:
            if _byte_len(prefix) > 253:
                problems.append("prefix part must be no more than 253 characters")
            if not _SUBDOMAIN.fullmatch(prefix):
                problems.append("prefix part " + _regex_error(_SUBDOMAIN_MSG, _SUBDOMAIN_FMT, "example.com"))
    name = parts[-1]
    if not name:
        problems.append("name part must be non-empty")
    elif _byte_len(name) > 63:
        problems.append("name part must be no more than 63 characters")
    if not _QUALIFIED_NAME.fullmatch(name):
        problems.append(
            "name part " + _regex_error(_QUALIFIED_NAME_MSG, _QUALIFIED_NAME_FMT, "MyName", "my.name", "123-abc")
        )
    return problems


def _label_value_problems(value: str) -> list[str]:
    """``validation.IsValidLabelValue``."""
    problems = []
    if _byte_len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _LABEL_VALUE.fullmatch(value):
        problems.append(_regex_error(_LABEL_VALUE_MSG, _LABEL_VALUE_FMT, "MyValue", "my_value", "12345"))
    return problems


def _check_key(key: str) -> None:
    if problems := _qualified_name_problems(key):
        raise SelectorError(f"invalid label key {go_quote(key)}: {'; '.join(problems)}")


def new_requirement(key: str, op: Operator, values: Iterable[str] = ()) -> Requirement:
    """A checked requirement (``labels.NewRequirement``); values become a sorted set.

    Errors: :class:`SelectorError` with the API server's message for an invalid key, a value count
    the operator does not take, a non-integer for ``gt``/``lt``, or an invalid value.
    """
    given = list(values)
    _check_key(key)
    match op:
        case Operator.IN | Operator.NOT_IN:
            if not given:
                raise SelectorError("for 'in', 'notin' operators, values set can't be empty")
        case Operator.EQUALS | Operator.DOUBLE_EQUALS | Operator.NOT_EQUALS:
            if len(given) != 1:
                raise SelectorError("exact-match compatibility requires one single value")
        case Operator.EXISTS | Operator.DOES_NOT_EXIST:
            if given:
                raise SelectorError("values set must be empty for exists and does not exist")
        case _:
            if len(given) != 1:
                raise SelectorError("for 'Gt', 'Lt' operators, exactly one value is required")
            if go_int(given[0]) is None:
                raise SelectorError("for 'Gt', 'Lt' operators, the value must be an integer")
    for value in given:
        if problems := _label_value_problems(value):
            raise SelectorError(
                f"invalid label value: {go_quote(value)}: at key: {go_quote(key)}: {'; '.join(problems)}"
            )
    return Requirement(key=key, op=op, values=tuple(sorted(set(given))))


_GO_ESCAPES: Final = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r", "\t": r"\t", "\v": r"\v"}


def go_quote(text: str) -> str:
    """Go's ``%q`` of a string (``strconv.Quote``): double quotes, Go's escapes, printable text kept."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch in _GO_ESCAPES:
            out.append(_GO_ESCAPES[ch])
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        elif ord(ch) < 0x10000:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    out.append('"')
    return "".join(out)


# ----------------------------------------------------------------------------------- the parser


class _Tok(enum.Enum):
    END = enum.auto()
    CLOSE = enum.auto()
    COMMA = enum.auto()
    NOT = enum.auto()
    DOUBLE_EQUALS = enum.auto()
    EQUALS = enum.auto()
    GREATER = enum.auto()
    IDENT = enum.auto()
    IN = enum.auto()
    LESS = enum.auto()
    NOT_EQUALS = enum.auto()
    NOT_IN = enum.auto()
    OPEN = enum.auto()


_KEYWORDS: Final = {
    ")": _Tok.CLOSE,
    ",": _Tok.COMMA,
    "!": _Tok.NOT,
    "==": _Tok.DOUBLE_EQUALS,
    "=": _Tok.EQUALS,
    ">": _Tok.GREATER,
    "in": _Tok.IN,
    "<": _Tok.LESS,
    "!=": _Tok.NOT_EQUALS,
    "notin": _Tok.NOT_IN,
    "(": _Tok.OPEN,
}
_BINARY: Final = {
    _Tok.IN: Operator.IN,
    _Tok.EQUALS: Operator.EQUALS,
    _Tok.DOUBLE_EQUALS: Operator.DOUBLE_EQUALS,
    _Tok.GREATER: Operator.GREATER_THAN,
    _Tok.LESS: Operator.LESS_THAN,
    _Tok.NOT_IN: Operator.NOT_IN,
    _Tok.NOT_EQUALS: Operator.NOT_EQUALS,
}
_SPECIAL: Final = frozenset("=!(),><")
_WHITESPACE: Final = frozenset(" \t\r\n")
_END: Final = "\0"
"""What Go's lexer reads past the end, and what it therefore also takes a NUL character for."""


class _Lexer:
    """``labels.Lexer``, read for read: where Go consumes a character (a NUL, which it cannot tell
    from the end of the text), so does this, so that both split any text into the same tokens."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._pos = 0

    def _read(self) -> str:
        if self._pos < len(self._text):
            self._pos += 1
            return self._text[self._pos - 1]
        return _END

    def _unread(self) -> None:
        self._pos -= 1

    def tokens(self) -> list[tuple[_Tok, str]]:
        """Every token up to the end (``Parser.scan``)."""
        items: list[tuple[_Tok, str]] = []
        while True:
            ch = self._read()
            while ch in _WHITESPACE:
                ch = self._read()
            if ch == _END:
                items.append((_Tok.END, ""))
                return items
            self._unread()
            items.append(self._symbol() if ch in _SPECIAL else self._word())

    def _symbol(self) -> tuple[_Tok, str]:
        # The longest run of symbols that is a token: "!=" is one, "=!" is "=" then "!".
        found = ""
        while (ch := self._read()) != _END:
            if ch not in _SPECIAL:
                self._unread()
                break
            if found + ch not in _KEYWORDS:
                self._unread()
                break
            found += ch
        return _KEYWORDS[found], found

    def _word(self) -> tuple[_Tok, str]:
        chars = []
        while (ch := self._read()) != _END:
            if ch in _SPECIAL or ch in _WHITESPACE:
                self._unread()
                break
            chars.append(ch)
        word = "".join(chars)
        return _KEYWORDS.get(word, _Tok.IDENT), word


class _Parser:
    """``labels.Parser``: recursive descent over the scanned tokens, one token of lookahead."""

    def __init__(self, text: str) -> None:
        self._items = _Lexer(text).tokens()
        self._pos = 0

    def _peek(self, *, values: bool = True) -> tuple[_Tok, str]:
        return self._as(self._items[self._pos], values=values)

    def _take(self, *, values: bool = True) -> tuple[_Tok, str]:
        self._pos += 1
        return self._as(self._items[self._pos - 1], values=values)

    @staticmethod
    def _as(item: tuple[_Tok, str], *, values: bool) -> tuple[_Tok, str]:
        # Where values are expected, "in" and "notin" are plain words.
        tok, lit = item
        return (_Tok.IDENT, lit) if values and tok in (_Tok.IN, _Tok.NOT_IN) else (tok, lit)

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            tok, lit = self._peek()
            if tok is _Tok.END:
                return requirements
            if tok not in (_Tok.IDENT, _Tok.NOT):
                raise SelectorError(f"found '{lit}', expected: !, identifier, or 'end of string'")
            try:
                requirements.append(self._requirement())
            except SelectorError as exc:
                raise SelectorError(f"unable to parse requirement: {exc}") from None
            tok, lit = self._take()
            if tok is _Tok.END:
                return requirements
            if tok is not _Tok.COMMA:
                raise SelectorError(f"found '{lit}', expected: ',' or 'end of string'")
            tok, lit = self._peek()
            if tok not in (_Tok.IDENT, _Tok.NOT):
                raise SelectorError(f"found '{lit}', expected: identifier after ','")

    def _requirement(self) -> Requirement:
        negated = False
        tok, key = self._take()
        if tok is _Tok.NOT:
            negated = True
            tok, key = self._take()
        if tok is not _Tok.IDENT:
            raise SelectorError(f"found '{key}', expected: identifier")
        _check_key(key)
        if self._peek()[0] in (_Tok.END, _Tok.COMMA):
            return new_requirement(key, Operator.DOES_NOT_EXIST if negated else Operator.EXISTS)
        if negated:
            # "!key" followed by anything else: the caller reports what follows.
            return new_requirement(key, Operator.DOES_NOT_EXIST)
        tok, lit = self._take(values=False)
        op = _BINARY.get(tok)
        if op is None:
            raise SelectorError(f"found '{lit}', expected: '=', '!=', '==', 'in', notin'")
        values = self._set() if op in (Operator.IN, Operator.NOT_IN) else self._exact()
        return new_requirement(key, op, values)

    def _set(self) -> set[str]:
        tok, lit = self._take()
        if tok is not _Tok.OPEN:
            raise SelectorError(f"found '{lit}' expected: '('")
        tok, lit = self._peek()
        if tok is _Tok.CLOSE:  # "()" is the empty value
            self._take()
            return {""}
        if tok not in (_Tok.IDENT, _Tok.COMMA):
            raise SelectorError(f"found '{lit}', expected: ',', ')' or identifier")
        found = self._identifiers()
        self._take()  # the ")" that _identifiers saw
        return found

    def _identifiers(self) -> set[str]:
        # Empty items count as the empty value: "(,a)", "(a,)" and "(a,,b)" all hold "".
        found: set[str] = set()
        while True:
            tok, lit = self._take()
            if tok is _Tok.IDENT:
                found.add(lit)
                after, after_lit = self._peek()
                if after is _Tok.CLOSE:
                    return found
                if after is not _Tok.COMMA:
                    raise SelectorError(f"found '{after_lit}', expected: ',' or ')'")
            elif tok is _Tok.COMMA:
                if not found:
                    found.add("")
                after, _ = self._peek()
                if after is _Tok.CLOSE:
                    found.add("")
                    return found
                if after is _Tok.COMMA:
                    self._take()
                    found.add("")
            else:
                raise SelectorError(f"found '{lit}', expected: ',', or identifier")

    def _exact(self) -> list[str]:
        tok, _ = self._peek()
        if tok in (_Tok.END, _Tok.COMMA):  # "key=" is the empty value
            return [""]
        tok, lit = self._take()
        if tok is not _Tok.IDENT:
            raise SelectorError(f"found '{lit}', expected: identifier")
        return [lit]


def parse_label_selector(text: str) -> tuple[Requirement, ...]:
    """The requirements of a ``labelSelector`` string, sorted by key; empty text selects everything.

    Errors: :class:`SelectorError` carrying the API server's message, e.g. ``unable to parse
    requirement: found 'b', expected: '=', '!=', '==', 'in', notin'`` for ``"a b"``.
    """
    return tuple(sorted(_Parser(text).parse(), key=lambda r: r.key))
