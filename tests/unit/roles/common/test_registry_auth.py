"""Image references normalise as docker's do, and each image gets its own registry's credentials."""

from __future__ import annotations

import base64
import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.common.registry_auth import (
    DockerConfig,
    ImageRef,
    RegistryAuth,
    api_host,
    decode_credentials,
    parse_docker_config_json,
    parse_image,
)

DIGEST = "sha256:" + "ab" * 32


def config(auths: dict[str, object]) -> DockerConfig:
    return parse_docker_config_json(json.dumps({"auths": auths}))


def basic(user: str, password: str) -> dict[str, object]:
    return {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}


# ----------------------------------------------------------------------------------- image references


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        ("nginx", ImageRef("docker.io", "library/nginx")),
        ("nginx:1.25", ImageRef("docker.io", "library/nginx", tag="1.25")),
        ("library/nginx", ImageRef("docker.io", "library/nginx")),
        ("docker.io/nginx", ImageRef("docker.io", "library/nginx")),
        ("index.docker.io/library/nginx:latest", ImageRef("docker.io", "library/nginx", tag="latest")),
        ("bitnami/redis", ImageRef("docker.io", "bitnami/redis")),
        (f"busybox@{DIGEST}", ImageRef("docker.io", "library/busybox", digest=DIGEST)),
        ("localhost/app", ImageRef("localhost", "app")),
        ("localhost:5000/app:v1", ImageRef("localhost:5000", "app", tag="v1")),
        (f"127.0.0.1:5000/team/app:v2@{DIGEST}", ImageRef("127.0.0.1:5000", "team/app", tag="v2", digest=DIGEST)),
        ("registry.example.com/a/b/c:tag", ImageRef("registry.example.com", "a/b/c", tag="tag")),
        ("Registry.Example.com/app", ImageRef("Registry.Example.com", "app")),
        ("[::1]:5000/app", ImageRef("[::1]:5000", "app")),
    ],
)
def test_image_references_normalise_like_docker(image: str, expected: ImageRef) -> None:
    """A bare name is Docker Hub's, library/ is implied for one-part names, and a port is never a tag."""
    assert parse_image(image) == expected


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("", "image reference is empty"),
        ("ab" * 32, "is a bare image ID"),
        ("nginx:bad tag", "invalid tag 'bad tag'"),
        ("Nginx", "the repository name must be lowercase"),
        ("example.com/App", "the repository name must be lowercase"),
        ("example.com//app", "invalid repository name '/app'"),
        ("nginx@sha256:xyz", "invalid digest 'sha256:xyz'"),
        ("http://example.com/app", "invalid registry host 'http:'"),
        ("exa_mple.com/app", "invalid registry host 'exa_mple.com'"),
        ("example.com/" + "a" * 250, "longer than 255 characters"),
    ],
)
def test_malformed_image_references_are_rejected_with_the_reason(image: str, message: str) -> None:
    """Each broken reference raises ValueError naming the image and the broken part."""
    with pytest.raises(ValueError, match=message) as info:
        parse_image(image)
    if image:
        assert repr(image) in str(info.value)


def test_a_reference_retagged_loses_its_digest_and_only_docker_hub_has_another_api_host() -> None:
    """``with_tag`` checks the tag as the parser does; ``docker.io`` is served at ``registry-1.docker.io``."""
    ref = parse_image(f"busybox:1@{DIGEST}")
    assert ref.with_tag("v2") == ImageRef("docker.io", "library/busybox", tag="v2")
    with pytest.raises(ValueError, match=r"invalid tag 'v 2' for image docker\.io/library/busybox"):
        ref.with_tag("v 2")
    assert [api_host(r) for r in ("docker.io", "127.0.0.1:5000", "ghcr.io")] == [
        "registry-1.docker.io",
        "127.0.0.1:5000",
        "ghcr.io",
    ]


hosts = st.builds(
    lambda labels, port: ".".join(labels) + (f":{port}" if port else ""),
    st.lists(st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True), min_size=2, max_size=4),
    st.one_of(st.none(), st.integers(1, 65535)),
).filter(lambda h: h.split(":")[0] not in ("docker.io", "index.docker.io", "registry-1.docker.io"))
repositories = st.lists(st.from_regex(r"[a-z0-9]+([._-][a-z0-9]+)?", fullmatch=True), min_size=1, max_size=3).map(
    "/".join
)
refs = st.builds(
    ImageRef,
    registry=hosts,
    repository=repositories,
    tag=st.one_of(st.just(""), st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)),
    digest=st.one_of(st.just(""), st.just(DIGEST)),
)


@given(refs)
def test_image_references_round_trip(ref: ImageRef) -> None:
    """A reference with an explicit registry parses back to the same parts."""
    assert parse_image(str(ref)) == ref


@given(st.text(max_size=80))
def test_any_text_as_an_image_either_parses_or_raises_value_error(text: str) -> None:
    """Garbage never crashes the parser with anything but ValueError."""
    with contextlib.suppress(ValueError):
        parse_image(text)


# ----------------------------------------------------------------------------------- credentials


def test_credentials_come_from_auth_or_from_username_and_password() -> None:
    """`auth` is base64 of user:password (colons allowed in the password) and wins over the separate fields."""
    cfg = config(
        {
            "a.example.com": basic("alice", "pa:ss"),
            "b.example.com": {"username": "bob", "password": "pw"},
            "c.example.com": {**basic("carol", "right"), "username": "mallory", "password": "wrong"},
            "d.example.com": {"identitytoken": "tok"},
        }
    )
    assert cfg.auth_for("a.example.com/app") == RegistryAuth("a.example.com", "alice", "pa:ss")
    assert cfg.auth_for("b.example.com/app") == RegistryAuth("b.example.com", "bob", "pw")
    assert cfg.auth_for("c.example.com/app") == RegistryAuth("c.example.com", "carol", "right")
    assert cfg.auth_for("d.example.com/app") == RegistryAuth("d.example.com", identity_token="tok")
    assert cfg.registries == ("a.example.com", "b.example.com", "c.example.com", "d.example.com")


@pytest.mark.parametrize(
    "key",
    ["https://index.docker.io/v1/", "index.docker.io", "docker.io", "registry-1.docker.io", "https://docker.io/v2/"],
)
@pytest.mark.parametrize(
    "image",
    ["nginx", "library/nginx:1", "docker.io/library/nginx", f"index.docker.io/bitnami/redis@{DIGEST}"],
)
def test_every_docker_hub_key_form_serves_every_docker_hub_image_form(key: str, image: str) -> None:
    """Docker Hub's aliases and the legacy v1 URL all name the registry of bare image names."""
    assert config({key: basic("hub", "pw")}).auth_for(image) == RegistryAuth(key, "hub", "pw")


@pytest.mark.parametrize(
    ("key", "image", "matches"),
    [
        ("127.0.0.1:5000", "127.0.0.1:5000/app:v1", True),
        ("http://127.0.0.1:5000", "127.0.0.1:5000/app", True),
        ("https://127.0.0.1:5000/v2/", "127.0.0.1:5000/team/app", True),
        ("127.0.0.1:5000", "127.0.0.1:5001/app", False),
        ("127.0.0.1:5000", "127.0.0.1/app", False),
        ("127.0.0.1", "127.0.0.1:5000/app", False),
        ("localhost:5000", "localhost:5000/app", True),
        ("localhost", "localhost/app", True),
        ("localhost", "nginx", False),
        ("docker.io", "quay.io/app", False),
        ("docker.io", "localhost/app", False),
        ("quay.io", "nginx", False),
        ("REGISTRY.example.com", "registry.EXAMPLE.com/app", True),
        ("*.example.com", "reg.example.com/app", True),
        ("*.example.com", "example.com/app", False),
        ("*.example.com", "a.reg.example.com/app", False),
        ("*.example.com:5000", "reg.example.com/app", False),
    ],
)
def test_credentials_match_the_image_registry_host_and_port(key: str, image: str, *, matches: bool) -> None:
    """Hosts compare case-insensitively with equal ports; a * label matches exactly one DNS label."""
    auth = config({key: basic("u", "p")}).auth_for(image)
    assert (auth is not None) == matches


def test_the_most_specific_key_wins() -> None:
    """A longer repository path beats the host alone, an exact host beats a wildcard, and ties go to the first."""
    cfg = config(
        {
            "*.example.com": basic("wild", "p"),
            "reg.example.com": basic("host", "p"),
            "reg.example.com/team-a": basic("team", "p"),
            "https://reg.example.com/v1/": basic("later-duplicate", "p"),
        }
    )

    def user(image: str) -> str | None:
        auth = cfg.auth_for(image)
        return None if auth is None else auth.username

    assert user("reg.example.com/team-a/app:v1") == "team"
    assert user("reg.example.com/team-a") == "team"
    assert user("reg.example.com/team-ab/app") == "host"
    assert user("reg.example.com/other") == "host"
    assert user("other.example.com/app") == "wild"
    assert user("nginx") is None


def test_an_empty_auths_object_pulls_everything_anonymously() -> None:
    """No keys means no credentials for any image, which is not an error."""
    assert parse_docker_config_json(b'{"auths": {}}').auth_for("nginx") is None


def test_secrets_never_show_in_a_repr() -> None:
    """Logging a RegistryAuth by mistake shows the registry and user, never the password or tokens."""
    auth = RegistryAuth("reg", "alice", "hunter2", identity_token="idtok", registry_token="regtok")
    text = repr(auth) + repr(DockerConfig(()))
    assert "alice" in text
    for secret in ("hunter2", "idtok", "regtok"):
        assert secret not in text


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"\xff\xfe\x00", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[]", "must be a JSON object, not an array"),
        ("{}", 'no "auths" object'),
        ('{"auths": null}', 'no "auths" object'),
        ('{"auths": []}', '"auths" must be an object, not an array'),
        ('{"auths": {"reg.io": "x"}}', r"auths\['reg.io'\] must be an object, not a string"),
        ('{"auths": {"reg.io": {"auth": 5}}}', r"auths\['reg.io'\].auth must be a string, not a number"),
        ('{"auths": {"reg.io": {"password": true}}}', r"\.password must be a string, not a boolean"),
        ('{"auths": {"reg.io": {"auth": "!!!"}}}', r"\.auth is not base64"),
        ('{"auths": {"reg.io": {"auth": "bm9jb2xvbg=="}}}', r"\.auth does not decode to 'username:password'"),
        ('{"auths": {"reg.io": {"email": "a@b"}}}', "has no credentials"),
        ('{"auths": {"ftp://reg.io": {"username": "u"}}}', "unsupported scheme 'ftp'"),
        ('{"auths": {"": {"username": "u"}}}', "'' is not a registry host"),
        ('{"auths": {"https://": {"username": "u"}}}', "'' is not a registry host"),
        ('{"auths": {"reg io": {"username": "u"}}}', "'reg io' is not a registry host"),
        ('{"auths": {"reg.io": ' + "[" * 100_000, "nested too deeply: more than 64 levels"),
    ],
)
def test_malformed_docker_config_is_rejected_with_the_reason(document: str | bytes, message: str) -> None:
    """Each broken document raises ValueError naming the broken part."""
    with pytest.raises(ValueError, match=message):
        parse_docker_config_json(document)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json", "credentials are not JSON"),
        ('{"registry": 1}', "a JSON object of strings"),
        ('{"registry": "r", "x": "y"}', "unknown fields"),
        (
            '{"registry": "r", "password": ' + "[" * 10_000 + "]" * 10_000 + "}",
            "nested too deeply: more than 64 levels",
        ),
    ],
)
def test_malformed_wire_credentials_are_a_value_error_with_the_reason(text: str, message: str) -> None:
    """Credentials from a RunAction that are not what the hub encodes are refused naming why, never crashing."""
    with pytest.raises(ValueError, match=message):
        decode_credentials(text)


def test_a_rejected_auth_never_echoes_the_secret() -> None:
    """The error for an undecodable `auth` names the entry, not its content."""
    token = base64.b64encode(b"s3cr3t-without-colon").decode()
    with pytest.raises(ValueError, match="does not decode") as info:
        parse_docker_config_json(json.dumps({"auths": {"reg.io": {"auth": token}}}))
    assert "s3cr3t" not in str(info.value)
    assert token not in str(info.value)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=12,
)


@given(
    st.one_of(
        json_values,
        st.builds(lambda auths: {"auths": auths}, json_values),
        st.builds(lambda key, entry: {"auths": {key: entry}}, st.text(max_size=20), json_values),
    )
)
def test_any_json_document_either_parses_or_raises_value_error(document: object) -> None:
    """Whatever JSON arrives in the Secret, parsing yields a config or a ValueError, never a crash."""
    try:
        cfg = parse_docker_config_json(json.dumps(document))
    except ValueError:
        return
    cfg.auth_for("nginx")  # a parsed config answers for any valid image


@given(st.binary(max_size=64))
def test_any_bytes_either_parse_or_raise_value_error(data: bytes) -> None:
    """Undecodable or non-JSON bytes are a ValueError too."""
    with contextlib.suppress(ValueError):
        parse_docker_config_json(data)


@given(
    host=hosts,
    user=st.text(min_size=1, max_size=12).filter(lambda u: ":" not in u),
    password=st.text(max_size=12),
    as_auth=st.booleans(),
)
def test_credentials_for_a_registry_reach_its_images(host: str, user: str, password: str, *, as_auth: bool) -> None:
    """Credentials written either way come back for an image of that registry, and only for it."""
    entry = basic(user, password) if as_auth else {"username": user, "password": password}
    cfg = config({host: entry})
    assert cfg.auth_for(f"{host}/app:v1") == RegistryAuth(host, user, password)
    assert cfg.auth_for(f"other-{host}/app") is None
