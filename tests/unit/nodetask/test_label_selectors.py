"""Label selectors: Kubernetes' syntax, checks, messages and matching, and metav1.LabelSelector's use of them."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.label_selectors import (
    Operator,
    Requirement,
    SelectorError,
    format_label_selector,
    go_quote,
    labels_match,
    new_requirement,
    parse_label_selector,
)
from schemas.meta import LabelSelector, LabelSelectorRequirement
from tests.unit.nodetask.selector_cases import LABEL_ERRORS

# "in" and "notin" are keys and values too: the parser reads them as words where words are expected.
KEYS = ("app", "tier", "example.com/zone", "a.b_c-d", "in", "notin")
VALUES = ("", "x", "y", "in", "a.b_c-d", "0", "7", "42")
NUMBERS = ("0", "7", "42")

labels_st = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=len(KEYS))


@st.composite
def requirements(draw: st.DrawFn) -> Requirement:
    key, op = draw(st.sampled_from(KEYS)), draw(st.sampled_from(Operator))
    match op:
        case Operator.IN | Operator.NOT_IN:
            values = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=3))
        case Operator.EXISTS | Operator.DOES_NOT_EXIST:
            values = []
        case Operator.GREATER_THAN | Operator.LESS_THAN:
            values = [draw(st.sampled_from(NUMBERS))]
        case _:
            values = [draw(st.sampled_from(VALUES))]
    return new_requirement(key, op, values)


def reference(req: Requirement, labels: dict[str, str]) -> bool:
    """What a requirement selects, from Kubernetes' documentation rather than from the code under test."""
    present = req.key in labels
    value = labels.get(req.key, "")
    if req.op in (Operator.EXISTS, Operator.DOES_NOT_EXIST):
        return present == (req.op is Operator.EXISTS)
    if req.op in (Operator.GREATER_THAN, Operator.LESS_THAN):
        if not present or not re.fullmatch(r"-?[0-9]+", value):
            return False
        return (int(value) - int(req.values[0])) * (1 if req.op is Operator.GREATER_THAN else -1) > 0
    among = present and value in set(req.values)
    return among if req.op in (Operator.IN, Operator.EQUALS, Operator.DOUBLE_EQUALS) else not among


def spaced(req: Requirement, gap: str) -> str:
    """``req`` written with ``gap`` (any run of Kubernetes' whitespace, possibly empty) between tokens."""
    values = list(req.values)
    match req.op:
        case Operator.EXISTS:
            return f"{gap}{req.key}{gap}"
        case Operator.DOES_NOT_EXIST:
            return f"{gap}!{gap}{req.key}{gap}"
        case Operator.IN | Operator.NOT_IN:
            inner = f"{gap},{gap}".join(values)
            return f"{gap}{req.key} {gap}{req.op}{gap} ({gap}{inner}{gap}){gap}"
        case Operator.GREATER_THAN | Operator.LESS_THAN:
            return f"{gap}{req.key}{gap}{'>' if req.op is Operator.GREATER_THAN else '<'}{gap}{values[0]}{gap}"
        case _:
            return f"{gap}{req.key}{gap}{req.op}{gap}{values[0]}{gap}"


@given(st.lists(requirements(), max_size=4), labels_st)
def test_a_selector_selects_exactly_what_its_requirements_say(reqs: list[Requirement], labels: dict[str, str]) -> None:
    """A selector of random requirements, written out and parsed back, matches a label set exactly when
    every requirement does by the reference reading."""
    parsed = parse_label_selector(format_label_selector(reqs))
    assert labels_match(parsed, labels) == all(reference(r, labels) for r in reqs)


@given(st.lists(requirements(), max_size=4))
def test_written_selectors_read_back_as_the_same_requirements(reqs: list[Requirement]) -> None:
    """Kubernetes' string form of requirements parses back to them, sorted by key."""
    assert parse_label_selector(format_label_selector(reqs)) == tuple(sorted(reqs, key=lambda r: r.key))


@given(st.lists(requirements(), min_size=1, max_size=4), st.sampled_from(["", " ", "\t", "  \n", "\r"]))
def test_whitespace_between_tokens_changes_nothing(reqs: list[Requirement], gap: str) -> None:
    """Spaces, tabs and line breaks around keys, operators, values and commas are ignored."""
    text = ",".join(spaced(r, gap) for r in reqs)
    assert parse_label_selector(text) == parse_label_selector(format_label_selector(reqs))


@given(st.text(alphabet="ab=!(),<> \tin0\x00", max_size=20) | st.text(max_size=20))
def test_any_text_parses_or_is_refused_with_a_selector_error(text: str) -> None:
    """Whatever a client sends, the parser returns requirements or raises SelectorError, nothing else."""
    with contextlib.suppress(SelectorError):
        parse_label_selector(text)


@pytest.mark.parametrize(("selector", "message"), LABEL_ERRORS)
def test_refusals_carry_the_api_servers_message(selector: str, message: str) -> None:
    """Each malformed selector is refused with the message the pinned API server gives for it."""
    with pytest.raises(SelectorError) as refused:
        parse_label_selector(selector)
    assert str(refused.value) == message


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("", ()),
        ("a in ()", (Requirement("a", Operator.IN, ("",)),)),
        ("a in (,b,,c,)", (Requirement("a", Operator.IN, ("", "b", "c")),)),
        ("a=", (Requirement("a", Operator.EQUALS, ("",)),)),
        ("a==,b", (Requirement("a", Operator.DOUBLE_EQUALS, ("",)), Requirement("b", Operator.EXISTS))),
        ("in in (in, notin)", (Requirement("in", Operator.IN, ("in", "notin")),)),
        ("x=y,a", (Requirement("a", Operator.EXISTS), Requirement("x", Operator.EQUALS, ("y",)))),
        ("a \x00b=c", (Requirement("a", Operator.EXISTS),)),  # a NUL where a token starts ends the text
        ("a=\x00b", (Requirement("a", Operator.EQUALS, ("b",)),)),  # one after a token is skipped
    ],
)
def test_kubernetes_quirks_are_kept(selector: str, expected: tuple[Requirement, ...]) -> None:
    """Empty values, keyword-like words and NUL characters read as Go's parser reads them."""
    assert parse_label_selector(selector) == expected


def test_greater_and_less_than_compare_integers_only() -> None:
    """``gt``/``lt`` select labels whose values are integers beyond the bound; others never match."""
    (gt,) = parse_label_selector("n>5")
    (lt,) = parse_label_selector("n<5")
    assert gt.matches({"n": "6"})
    assert not gt.matches({"n": "5"})
    assert not gt.matches({"n": "x"})
    assert lt.matches({"n": "-1"})
    assert not lt.matches({"n": "9223372036854775808"})
    assert not lt.matches({})


@pytest.mark.parametrize(
    ("selector", "labels", "selected"),
    [
        (f"n>{'9' * 5000}", None, None),  # Python's int() refuses more than 4,300 digits (a ValueError)
        (f"n<{'0' * 50}12", {"n": "11"}, True),  # leading zeros, as ParseInt skips them
        ("n>5", {"n": "0" * 5000 + "6"}, True),
        ("n>5", {"n": "9" * 5000}, False),  # a label value past int64 is no integer
    ],
)
def test_integers_of_any_length_are_read_as_go_reads_them(
    selector: str, labels: dict[str, str] | None, selected: bool | None
) -> None:
    """However many digits, a ``gt``/``lt`` bound is an int64 or refused with a SelectorError, never a ValueError."""
    if labels is None:
        with pytest.raises(SelectorError, match="the value must be an integer"):
            parse_label_selector(selector)
        return
    (requirement,) = parse_label_selector(selector)
    assert requirement.matches(labels) is selected


@pytest.mark.parametrize(
    ("text", "quoted"),
    [("plain", '"plain"'), ('a"b\\c', r'"a\"b\\c"'), ("é\n\x00\x7f", r'"é\n\x00\x7f"'), ("\u200b", r'"\u200b"')],
)
def test_values_are_quoted_as_go_quotes_them(text: str, quoted: str) -> None:
    """Keys and values in messages are quoted as Go's %q does."""
    assert go_quote(text) == quoted


label_selector_st = st.builds(
    LabelSelector,
    match_labels=st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2),
    match_expressions=st.lists(
        st.one_of(
            st.builds(
                LabelSelectorRequirement,
                key=st.sampled_from(KEYS),
                operator=st.sampled_from(["In", "NotIn"]),
                values=st.lists(st.sampled_from(VALUES), min_size=1, max_size=3).map(tuple),
            ),
            st.builds(
                LabelSelectorRequirement,
                key=st.sampled_from(KEYS),
                operator=st.sampled_from(["Exists", "DoesNotExist"]),
            ),
        ),
        max_size=3,
    ).map(tuple),
)


@given(label_selector_st, labels_st)
def test_a_jobs_label_selector_and_its_query_form_select_alike(selector: LabelSelector, labels: dict[str, str]) -> None:
    """A metav1.LabelSelector matches what its query-string form, parsed, matches: one rule for both."""
    assert selector.matches(labels) == labels_match(parse_label_selector(selector.to_query()), labels)
