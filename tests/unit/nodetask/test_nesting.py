"""The nesting guard counts JSON and YAML levels exactly for real documents and never lets a deeper one through."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from nodetask.nesting import MAX_DEPTH, AliasingError, NestingError, allowed_alias_ratio, check_json, load_yaml

ROOT = Path(__file__).resolve().parents[3]
# Strings full of what a careless scanner would take for structure.
tricky_text = st.text(alphabet=st.sampled_from('[]{}"\\/:, aé\n\t\u2028'), max_size=12) | st.text(max_size=8)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | tricky_text
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(tricky_text, children, max_size=4),
    max_leaves=40,
)


@st.composite
def chains(draw: st.DrawFn) -> Any:
    """A value nested up to twice the default limit, each level a list or an object, with a sibling."""
    value: Any = draw(scalars)
    for _ in range(draw(st.integers(0, 2 * MAX_DEPTH))):
        sibling = draw(st.sampled_from([None, "]", '"{', [], {"[": "}"}, [[1]]]))
        value = [sibling, value] if draw(st.booleans()) else {"~": sibling, "k": value}
    return value


def depth(value: Any) -> int:
    """Levels of lists and dicts in a decoded value: the reference the guard is held to."""
    if isinstance(value, list):
        return 1 + max(map(depth, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth, value.values()), default=0)
    return 0


def decoder_depth(text: str) -> int:
    """The deepest level a JSON decoder reading ``text`` from its start meets before a backslash outside
    a string stops it: a plain, character-by-character scan."""
    level = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            deepest = max(deepest, level)
        elif ch in "]}":
            level -= 1
        elif ch == "\\":
            break
    return deepest


def refuses(document: bytes | str, limit: int = MAX_DEPTH) -> bool:
    try:
        check_json(document, limit=limit)
    except NestingError:
        return True
    return False


# ------------------------------------------------------------------------------------------------ JSON


@given(json_values | chains(), st.integers(0, 8) | st.just(MAX_DEPTH), st.sampled_from([None, 1]), st.booleans())
def test_json_is_refused_exactly_when_deeper_than_the_limit(
    value: Any, limit: int, indent: int | None, ascii_: bool
) -> None:
    """Any JSON document, as str or bytes and however formatted, is refused iff it nests deeper than the limit."""
    text = json.dumps(value, indent=indent, ensure_ascii=ascii_)
    too_deep = depth(value) > limit
    assert refuses(text, limit) == too_deep
    assert refuses(text.encode(), limit) == too_deep


@given(st.text(alphabet=st.sampled_from('[]{}"\\ ab'), max_size=300), st.integers(0, 12))
@example('"\\\\"[[', 1)
@example('["\\"[[[", [[', 2)
@example("]]]][[[[", 3)
@example("[[[[[[]]]]]][[[[", 5)
@example("[[" * 5 + "]" * 5, 4)
def test_no_text_deeper_than_the_limit_gets_through(text: str, limit: int) -> None:
    """On any text, valid JSON or not, what the guard accepts a decoder can never nest deeper than the limit."""
    if not refuses(text, limit):
        assert decoder_depth(text) <= limit
    assert refuses(text, limit) == refuses(text.encode(), limit)


@pytest.mark.parametrize(
    ("document", "deepest"),
    [
        ('["[[[[[", "\\"[[[[", "\\\\", [[]]]', 3),  # brackets in strings, an escaped quote, an escaped backslash
        ('{"a": "}}}}]]]]", "b": [{"c": "\\\\\\"{{{{"}]}', 3),
        ('"[[[[', 0),  # a string never closed hides the rest
        ('[[["\\u005c"]]]', 3),  # an escaped backslash written as \u005c escapes nothing
    ],
)
def test_brackets_inside_strings_do_not_count(document: str, deepest: int) -> None:
    """Brackets between quotes, escaped quotes and escaped backslashes are read as a decoder reads them."""
    assert not refuses(document, deepest)
    if deepest:
        assert refuses(document, deepest - 1)


def test_the_limit_is_generous_for_real_documents_and_refuses_the_reported_frame() -> None:
    """64 levels pass, 65 do not, and the frame from the report is refused naming the limit."""
    assert not refuses("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert refuses("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    frame = '{"op":"heartbeat","x":' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(NestingError, match=f"more than {MAX_DEPTH} levels"):
        check_json(frame)
    with pytest.raises(NestingError):
        check_json(frame[:-5_000])  # unclosed: a decoder would still nest 10,000 deep before failing


def test_a_nesting_error_is_a_decode_error() -> None:
    """Callers that turn msgspec's DecodeError into a clear refusal do the same with a nesting error."""
    assert issubclass(NestingError, msgspec.DecodeError)
    assert issubclass(NestingError, ValueError)


# ------------------------------------------------------------------------------------------------ YAML


@given(json_values | chains(), st.integers(0, 8) | st.just(MAX_DEPTH), st.booleans())
def test_yaml_is_read_as_pyyaml_reads_it_and_refused_exactly_when_too_deep(value: Any, limit: int, flow: bool) -> None:
    """Block or flow YAML decodes to what PyYAML's safe loader gives, unless it nests deeper than the limit."""
    text = yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True)
    if depth(value) > limit:
        with pytest.raises(NestingError, match=f"more than {limit} levels .* at line"):
            load_yaml(text, limit=limit)
    else:
        assert load_yaml(text, limit=limit) == yaml.safe_load(text)


@pytest.mark.parametrize(
    "path", sorted([*(ROOT / "tests" / "data").glob("*.yaml"), *(ROOT / "containers" / "samples").glob("*.yaml")])
)
def test_yaml_files_of_the_project_decode_as_before(path: Path) -> None:
    """The sample manifests decode exactly as msgspec.yaml decodes them."""
    assert load_yaml(path.read_bytes()) == msgspec.yaml.decode(path.read_bytes())


def test_levels_an_alias_brings_in_count_where_it_is_used() -> None:
    """An alias adds the levels of the node it names: a shallow file cannot hide a deep value."""
    document = "a: &x [[1]]\nb: [*x]\n"  # b's value is three levels deep, inside the top mapping
    assert load_yaml(document, limit=4) == {"a": [[1]], "b": [[[1]]]}
    with pytest.raises(NestingError, match="more than 3 levels of arrays and objects at line 2, column 5"):
        load_yaml(document, limit=3)
    chain = "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 70))
    with pytest.raises(NestingError):
        load_yaml("a0: &a0 1\n" + chain)


def test_an_alias_inside_the_node_it_names_is_refused() -> None:
    """A self-referencing alias, an endless nesting, is refused with its place."""
    with pytest.raises(NestingError, match=r"the alias \*x at line 1, column 9 is inside the node it names"):
        load_yaml("a: &x [[*x]]")


def _laughs(levels: int, fan_out: int = 10) -> str:
    """The "billion laughs" document: each level a list of ``fan_out`` aliases to the one below."""
    lines = [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan_out)}]" for i in range(1, levels + 1)]
    return "\n".join(["l0: &l0 lol", *lines]) + "\n"


def test_aliases_that_would_expand_a_document_far_beyond_its_size_are_refused() -> None:
    """A billion laughs is refused with go-yaml's message, naming the alias where it went over; small documents pass."""
    assert len(load_yaml(_laughs(2))["l2"]) == 10  # 111 nodes: under the 1,000 any document may have
    with pytest.raises(AliasingError, match=r"excessive aliasing: the alias \*l2 at line 4, column \d+ brings"):
        load_yaml(_laughs(9))
    with pytest.raises(msgspec.DecodeError):  # what callers already catch
        load_yaml(_laughs(4))


def test_a_document_reusing_blocks_through_aliases_loads() -> None:
    """Merge keys and shared blocks, as real manifests use them, stay within the allowed aliasing."""
    nodes = "\n".join(f"  - name: node-{i}\n    <<: *defaults" for i in range(500))
    document = f"defaults: &defaults\n  labels: {{a: b, c: d}}\n  taints: [x, y]\nnodes:\n{nodes}\n"
    data = load_yaml(document)
    assert len(data["nodes"]) == 500
    assert data["nodes"][499] == {"name": "node-499", "labels": {"a": "b", "c": "d"}, "taints": ["x", "y"]}


@given(st.integers(min_value=0, max_value=6_000_000))
def test_the_allowed_alias_ratio_falls_from_99_to_10_percent(decoded: int) -> None:
    """go-yaml's bounds: 0.99 up to 400,000 nodes, 0.10 from 4,000,000, never rising in between."""
    ratio = allowed_alias_ratio(decoded)
    assert 0.10 <= ratio <= 0.99
    assert allowed_alias_ratio(decoded + 1000) <= ratio
    assert (ratio == 0.99) == (decoded <= 400_000)


def test_malformed_yaml_is_a_decode_error() -> None:
    """YAML that does not parse is reported as msgspec.yaml reports it."""
    with pytest.raises(msgspec.DecodeError, match="expected the node content"):
        load_yaml("a: [")
    with pytest.raises(msgspec.DecodeError, match="undefined alias"):
        load_yaml("a: *nowhere")
