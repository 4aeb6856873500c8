"""updateFields applied to a YAML document: keadm's value typing, dotted paths and list indices."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.edge.config_update.fields import FieldError, apply_fields, parse_path, typed_value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("true", True),
        ("false", False),
        ("null", None),
        ("42", 42),
        ("-7", -7),
        ("0", 0),
        ("007", "007"),
        ("1.5", "1.5"),
        ("True", "True"),
        ("", ""),
    ],
)
def test_values_are_typed_as_keadm_types_them(text: str, value: object) -> None:
    """Booleans, null and integers without a leading zero are typed; everything else stays a string."""
    assert typed_value(text) == value


def test_dotted_paths_and_indices_build_nested_values_in_sorted_key_order() -> None:
    """Dotted keys create mappings, [i] sets or appends list items, and the input is not modified."""
    document = {"hubUrls": ["ws://a"], "logLevel": "info"}
    updated = apply_fields(
        document, {"hubUrls[1]": "ws://b", "hubUrls[0]": "ws://c", "modules.edgeStream.enable": "true"}
    )
    assert updated == {
        "hubUrls": ["ws://c", "ws://b"],
        "logLevel": "info",
        "modules": {"edgeStream": {"enable": True}},
    }
    assert document == {"hubUrls": ["ws://a"], "logLevel": "info"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"": "x"}, "empty key"),
        ({"a..b": "x"}, "is not a name"),
        ({"logLevel.x": "1"}, "not a mapping"),
        ({"logLevel[0]": "1"}, "not a list"),
        ({"hubUrls[5]": "ws://x"}, "past the end"),
    ],
)
def test_fields_that_cannot_apply_name_the_key(fields: dict[str, str], message: str) -> None:
    """A path through a scalar, a bad segment or a gap in a list is refused with the key named."""
    with pytest.raises(FieldError, match=message):
        apply_fields({"logLevel": "info", "hubUrls": ["ws://a"]}, fields)


@given(st.text(max_size=30))
def test_any_key_either_parses_or_is_refused_with_a_field_error(key: str) -> None:
    """Arbitrary keys never raise anything but FieldError."""
    try:
        steps = parse_path(key)
    except FieldError:
        return
    assert steps


def test_a_key_of_thousands_of_parts_is_a_field_error_not_a_recursion_error() -> None:
    """Applying a path recurses once per part, so depth is bounded before anything is applied."""
    with pytest.raises(FieldError, match=r"'a\.a\.a.*\(5999 characters\) is deeper than 8 parts"):
        apply_fields({}, {".".join(["a"] * 3_000): "1"})
