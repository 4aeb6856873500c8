"""The bearer-token exchange's pure parts: challenges, the token URL, the token answer, and how long a token is kept."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.edge.upgrade.registry_token import (
    DEFAULT_EXPIRES_S,
    EARLY_S,
    Challenge,
    TokenError,
    Tokens,
    bearer_challenge,
    parse_challenges,
    parse_token_answer,
    pull_scope,
    token_url,
)

HUB = 'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull"'


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            HUB,
            [
                Challenge(
                    "bearer",
                    {
                        "realm": "https://auth.docker.io/token",
                        "service": "registry.docker.io",
                        "scope": "repository:library/busybox:pull",
                    },
                )
            ],
        ),
        (
            'BEARER Realm="https://r/t?a=1,b=2", Scope="repository:x:pull,push" , service=bare-token',
            [
                Challenge(
                    "bearer",
                    {"realm": "https://r/t?a=1,b=2", "scope": "repository:x:pull,push", "service": "bare-token"},
                )
            ],
        ),
        (
            r'Bearer realm="https://r/\"quoted\"\\t", error="insufficient_scope"',
            [Challenge("bearer", {"realm": 'https://r/"quoted"\\t', "error": "insufficient_scope"})],
        ),
        (
            'Basic realm="registry, inc", Bearer realm="https://r/t",service="s"',
            [
                Challenge("basic", {"realm": "registry, inc"}),
                Challenge("bearer", {"realm": "https://r/t", "service": "s"}),
            ],
        ),
        (
            'Negotiate abc123==, Bearer realm = "https://r"',
            [
                Challenge("negotiate", token68="abc123=="),
                Challenge("bearer", {"realm": "https://r"}),
            ],
        ),
        ("Bearer", [Challenge("bearer")]),
        (' , Bearer realm="https://r" ,', [Challenge("bearer", {"realm": "https://r"})]),
        ("", []),
    ],
)
def test_challenges_parse_with_quoted_commas_escapes_and_several_schemes(value: str, expected: list[Challenge]) -> None:
    """Quoted values keep their commas and escaped quotes; names are case-insensitive; schemes are split apart."""
    assert list(parse_challenges(value)) == expected


@pytest.mark.parametrize(
    "value",
    ['Bearer realm="https://unterminated', 'Bearer realm="x" junk', "=realm", 'Bearer realm="x",,"y"'],
)
def test_a_malformed_challenge_is_a_value_error_naming_where(value: str) -> None:
    """Text that is no challenge list raises ValueError with the offset and the value."""
    with pytest.raises(ValueError, match="offset"):
        parse_challenges(value)


token_chars = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.!#$%&'*+^`|~"))
names = token_chars.filter(bool)
values = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@given(
    st.lists(
        st.tuples(names, st.dictionaries(names.map(str.lower), values, max_size=4)),
        max_size=3,
    )
)
def test_rendered_challenges_parse_back_to_the_same_parameters(
    challenges: list[tuple[str, dict[str, str]]],
) -> None:
    """Any scheme and any printable parameter values, quoted as RFC 9110 says, parse back unchanged."""
    rendered = ", ".join(
        f"{scheme} " + ", ".join(f"{name}={_quote(value)}" for name, value in params.items())
        for scheme, params in challenges
    )
    parsed = parse_challenges(rendered)
    assert [(c.scheme, dict(c.params)) for c in parsed] == [(s.lower(), p) for s, p in challenges]


@given(st.text(max_size=80))
def test_any_text_as_a_challenge_either_parses_or_raises_value_error(text: str) -> None:
    """Whatever a registry sends, the parser raises nothing but ValueError."""
    with contextlib.suppress(ValueError):
        parse_challenges(text)


def test_the_bearer_challenge_is_picked_among_several_headers() -> None:
    """Basic challenges are skipped; a Bearer one without a realm is an error; none at all is None."""
    assert bearer_challenge(['Basic realm="x"', HUB]) == parse_challenges(HUB)[0]
    assert bearer_challenge(['Basic realm="x"']) is None
    assert bearer_challenge([]) is None
    with pytest.raises(ValueError, match="has no realm"):
        bearer_challenge(['Bearer service="s"'])


def test_the_token_url_carries_service_and_our_scope() -> None:
    """The realm's own query is kept, service and scope are appended encoded, a fragment is dropped."""
    challenge = Challenge("bearer", {"realm": "https://auth.example.com/token?v=2#x", "service": "reg x"})
    url = token_url(challenge, pull_scope("team/agent"), plain_ok=lambda _: False)
    assert url == "https://auth.example.com/token?v=2&service=reg+x&scope=repository%3Ateam%2Fagent%3Apull"
    no_service = Challenge("bearer", {"realm": "https://auth.example.com/token"})
    assert token_url(no_service, "s", plain_ok=lambda _: False) == "https://auth.example.com/token?scope=s"


def test_a_plain_http_realm_is_refused_unless_its_host_may_be_reached_so() -> None:
    """Plain HTTP only where insecureRegistries (or loopback) allows it, and never another scheme."""
    challenge = Challenge("bearer", {"realm": "http://auth.lan:8080/token"})
    with pytest.raises(TokenError, match=r"plain HTTP \(list auth\.lan:8080 in insecureRegistries to allow it\)"):
        token_url(challenge, "s", plain_ok=lambda _: False)
    assert token_url(challenge, "s", plain_ok=lambda host: host == "auth.lan:8080").startswith("http://auth.lan")
    with pytest.raises(TokenError, match="not an http"):
        token_url(Challenge("bearer", {"realm": "file:///etc/passwd"}), "s", plain_ok=lambda _: True)


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ({"token": "abc", "expires_in": 300}, ("abc", 300)),
        ({"access_token": "oauth", "expires_in": 120.5}, ("oauth", 120)),
        ({"token": "first", "access_token": "second"}, ("first", DEFAULT_EXPIRES_S)),
        ({"token": "abc", "expires_in": 0}, ("abc", DEFAULT_EXPIRES_S)),
        ({"token": "abc", "expires_in": "300"}, ("abc", DEFAULT_EXPIRES_S)),
        ({"token": "abc", "expires_in": True}, ("abc", DEFAULT_EXPIRES_S)),
    ],
)
def test_a_token_answer_gives_the_token_and_its_lifetime(answer: object, expected: tuple[str, int]) -> None:
    """``token`` or ``access_token``; a missing or unusable ``expires_in`` is the specification's 60 seconds."""
    assert parse_token_answer(json.dumps(answer).encode()) == expected


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"token": ""}', "has no token"),
        (b'{"token": 5}', "has no token"),
        (b'{"token": "a\\r\\nX-Injected: 1"}', "a header cannot carry"),
        (b"[" * 100_000, "not JSON"),
        (b"Infinity", "not a JSON object"),
    ],
)
def test_an_unusable_token_answer_is_refused_with_the_reason(body: bytes, message: str) -> None:
    """Anything but a JSON object with a header-safe token is a TokenError, never a crash."""
    with pytest.raises(TokenError, match=message):
        parse_token_answer(body)


def test_a_token_is_kept_per_registry_and_scope_until_shortly_before_it_expires() -> None:
    """Within its lifetime (less a margin) a token is returned; after it, or for another scope, none is."""
    now = [1000.0]
    tokens = Tokens(clock=lambda: now[0])
    tokens.put("reg", "repository:a:pull", "T", 60, asked_at=1000.0)
    assert tokens.get("reg", "repository:a:pull") == "T"
    assert tokens.get("reg", "repository:b:pull") == ""
    assert tokens.get("other", "repository:a:pull") == ""
    now[0] = 1000.0 + 60 - EARLY_S - 0.001
    assert tokens.get("reg", "repository:a:pull") == "T"
    now[0] = 1000.0 + 60 - EARLY_S
    assert tokens.get("reg", "repository:a:pull") == ""
    tokens.put("reg", "repository:a:pull", "T2", 60, asked_at=now[0])
    tokens.forget("reg", "repository:a:pull")
    assert tokens.get("reg", "repository:a:pull") == ""
