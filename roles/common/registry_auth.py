"""Registry credentials for an image, from a ``kubernetes.io/dockerconfigjson`` Secret.

Why this exists: KubeEdge unmarshals the whole ``.dockerconfigjson`` into one CRI ``AuthConfig``,
whose fields a ``{"auths": {...}}`` document does not have, so every pull ends up anonymous. Here
the document is parsed once into per-registry entries, and each image gets the entry of its own
registry, matched the way docker and the kubelet do:

- an image's registry is the first path component when that looks like a host (contains ``.`` or
  ``:``, is ``localhost``, or has upper case), else Docker Hub: ``nginx``, ``library/nginx`` and
  ``docker.io/library/nginx`` are one image (``distribution/reference``'s normalisation);
- a key may carry a scheme and a path (``https://index.docker.io/v1/``, ``http://reg:5000``,
  ``reg.example.com/team``); ``/v1/`` and ``/v2/`` path prefixes mean the host itself, and the
  Docker Hub aliases ``index.docker.io`` and ``registry-1.docker.io`` mean ``docker.io``;
- ports must be equal (``reg:5000`` and ``reg`` are different registries); a ``*`` label matches
  one DNS label (``*.example.com``, as the kubelet);
- among several matching keys the one with the longest repository path wins, then an exact host
  over a wildcard, then the first in the document.

Everything here is pure: malformed input raises :class:`ValueError` naming what is wrong, never
anything else, and nothing here logs (the password must never reach a log line or a repr).
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
import re
from dataclasses import dataclass, replace

from nodetask import image_reference, nesting
from nodetask.messages import RunAction
from nodetask.registry_credentials import RegistryAuth

__all__ = [
    "DOCKER_HUB",
    "DOCKER_HUB_API",
    "DockerConfig",
    "ImageRef",
    "RegistryAuth",
    "api_host",
    "credentials_of",
    "decode_credentials",
    "encode_credentials",
    "parse_docker_config_json",
    "parse_image",
]

DOCKER_HUB = "docker.io"
"""The registry of an image reference without a host."""

DOCKER_HUB_API = "registry-1.docker.io"
"""Where Docker Hub's registry API answers: ``docker.io`` names the registry, it serves no ``/v2/``."""

_HUB_ALIASES = frozenset({"docker.io", "index.docker.io", "registry-1.docker.io"})

_MAX_NAME = 255
"""Longest name (host and path) of a reference; the grammar is :mod:`nodetask.image_reference`."""
# A key's host may hold ``*`` labels (``*.example.com``), which the reference grammar does not.
_KEY_HOST_RE = re.compile(r"(?:[a-zA-Z0-9*-]+(?:\.[a-zA-Z0-9*-]+)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?")


@dataclass(frozen=True, slots=True)
class ImageRef:
    """An image reference split into its normalised parts."""

    registry: str
    """Host[:port] as written (``docker.io`` when the reference names no host)."""
    repository: str
    """The path inside the registry, e.g. ``library/nginx``."""
    tag: str = ""
    digest: str = ""

    def __str__(self) -> str:
        tag = f":{self.tag}" if self.tag else ""
        digest = f"@{self.digest}" if self.digest else ""
        return f"{self.registry}/{self.repository}{tag}{digest}"

    def with_tag(self, tag: str) -> ImageRef:
        """This image at ``tag`` and no digest. Errors: :class:`ValueError` for a tag docker would refuse."""
        if not image_reference.TAG.fullmatch(tag):
            raise ValueError(f"invalid tag {tag!r} for image {self.registry}/{self.repository}")
        return replace(self, tag=tag, digest="")


def api_host(registry: str) -> str:
    """The host[:port] an HTTP request for ``registry``'s images goes to (Docker Hub's API host for ``docker.io``).

    References and credentials keep the name ``docker.io``; only a client that speaks the
    distribution API needs the endpoint, so only it calls this.
    """
    return DOCKER_HUB_API if registry == DOCKER_HUB else registry


def parse_image(image: str) -> ImageRef:
    """Split ``image`` the way ``distribution/reference.ParseNormalizedNamed`` does.

    Errors: :class:`ValueError` naming the image and the broken part.
    """
    if not image:
        raise ValueError("image reference is empty")
    if image_reference.IMAGE_ID.fullmatch(image):
        raise ValueError(f"image reference {image!r} is a bare image ID, not a name")
    rest, _, digest = image.partition("@")
    if digest and not image_reference.DIGEST.fullmatch(digest):
        raise ValueError(f"image reference {image!r} has an invalid digest {digest!r}")
    # A tag is whatever follows the last ':' after the last '/', so a port is never taken for one.
    name, tag = rest, ""
    colon = rest.rfind(":")
    if colon > rest.rfind("/"):
        name, tag = rest[:colon], rest[colon + 1 :]
        if not image_reference.TAG.fullmatch(tag):
            raise ValueError(f"image reference {image!r} has an invalid tag {tag!r}")
    if len(name) > _MAX_NAME:
        raise ValueError(f"image reference {image!r} has a name longer than {_MAX_NAME} characters")
    registry, repository = _split_registry(name, image)
    if repository != repository.lower():
        raise ValueError(f"image reference {image!r}: the repository name must be lowercase")
    if not image_reference.PATH.fullmatch(repository):
        raise ValueError(f"image reference {image!r} has an invalid repository name {repository!r}")
    return ImageRef(registry=registry, repository=repository, tag=tag, digest=digest)


def _split_registry(name: str, image: str) -> tuple[str, str]:
    """(registry, repository) of a name without tag or digest (``splitDockerDomain``)."""
    first, slash, remainder = name.partition("/")
    if not slash or ("." not in first and ":" not in first and first != "localhost" and first == first.lower()):
        registry, repository = DOCKER_HUB, name
    else:
        registry, repository = first, remainder
        if not image_reference.DOMAIN.fullmatch(registry):
            raise ValueError(f"image reference {image!r} has an invalid registry host {registry!r}")
    if registry.lower() in _HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in repository:
            repository = f"library/{repository}"
    return registry, repository


@dataclass(frozen=True, slots=True)
class _Entry:
    host: str  # lower-cased host[:port], Docker Hub aliases folded into docker.io
    path: str  # repository prefix without slashes at either end, "" for the whole registry
    auth: RegistryAuth

    @property
    def wildcard(self) -> bool:
        return "*" in self.host

    def matches(self, ref: ImageRef) -> bool:
        if not _host_matches(self.host, ref.registry.lower()):
            return False
        return not self.path or ref.repository == self.path or ref.repository.startswith(f"{self.path}/")


def _split_port(host: str) -> tuple[str, str]:
    if host.startswith("["):  # [ipv6]:port
        end = host.find("]")
        return host[: end + 1], host[end + 2 :]
    name, _, port = host.partition(":")
    return name, port


def _host_matches(pattern: str, host: str) -> bool:
    if pattern == host:
        return True
    pattern_name, pattern_port = _split_port(pattern)
    name, port = _split_port(host)
    if pattern_port != port:
        return False
    pattern_labels, labels = pattern_name.split("."), name.split(".")
    return len(pattern_labels) == len(labels) and all(
        fnmatch.fnmatchcase(label, glob) for glob, label in zip(pattern_labels, labels, strict=True)
    )


@dataclass(frozen=True, slots=True)
class DockerConfig:
    """The registries of one ``.dockerconfigjson`` document; see the module docstring for matching."""

    entries: tuple[_Entry, ...] = ()

    def auth_for(self, image: str) -> RegistryAuth | None:
        """The credentials for ``image``'s registry, or None to pull anonymously.

        Errors: :class:`ValueError` if ``image`` is not a valid image reference.
        """
        ref = parse_image(image)
        best: _Entry | None = None
        for entry in self.entries:
            # Strictly better only, so that among equals the first in the document wins.
            if entry.matches(ref) and (
                best is None or (len(entry.path), not entry.wildcard) > (len(best.path), not best.wildcard)
            ):
                best = entry
        return None if best is None else best.auth

    @property
    def registries(self) -> tuple[str, ...]:
        """The keys of the document, in order (for logs: no secrets)."""
        return tuple(entry.auth.registry for entry in self.entries)


def parse_docker_config_json(data: bytes | str) -> DockerConfig:
    """Parse the ``.dockerconfigjson`` of a ``kubernetes.io/dockerconfigjson`` Secret (decoded, not base64).

    Each ``auths`` entry takes ``auth`` (base64 of ``user:password``; wins over the separate fields,
    as in docker), or ``username``/``password``, or ``identitytoken``/``registrytoken``.

    Errors: :class:`ValueError` naming the broken part (never the password).
    """
    try:
        nesting.check_json(data)
    except nesting.NestingError as exc:
        raise ValueError(f".dockerconfigjson is {exc}") from None
    try:
        doc = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer too long to convert
        raise ValueError(f".dockerconfigjson is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError(f".dockerconfigjson must be a JSON object, not {_json_type(doc)}")
    auths = doc.get("auths")
    if auths is None:
        raise ValueError('.dockerconfigjson has no "auths" object')
    if not isinstance(auths, dict):
        raise ValueError(f'.dockerconfigjson "auths" must be an object, not {_json_type(auths)}')
    return DockerConfig(entries=tuple(_entry(key, value) for key, value in auths.items()))


def _entry(key: str, value: object) -> _Entry:
    where = f".dockerconfigjson auths[{key!r}]"
    host, path = _parse_key(key, where)
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object, not {_json_type(value)}")
    fields: dict[str, str] = {}
    for name in ("auth", "username", "password", "identitytoken", "registrytoken"):
        raw = value.get(name)
        if raw is None:
            continue
        if not isinstance(raw, str):
            raise ValueError(f"{where}.{name} must be a string, not {_json_type(raw)}")
        fields[name] = raw
    username, password = fields.get("username", ""), fields.get("password", "")
    if fields.get("auth"):
        username, password = _decode_auth(fields["auth"], where)
    identity_token, registry_token = fields.get("identitytoken", ""), fields.get("registrytoken", "")
    if not (username or password or identity_token or registry_token):
        raise ValueError(f"{where} has no credentials (auth, username/password, identitytoken or registrytoken)")
    auth = RegistryAuth(
        registry=key,
        username=username,
        password=password,
        identity_token=identity_token,
        registry_token=registry_token,
    )
    return _Entry(host=host, path=path, auth=auth)


def _parse_key(key: str, where: str) -> tuple[str, str]:
    """(host, path) of an ``auths`` key, as the kubelet's keyring reads it."""
    rest = key
    scheme, sep, after = key.partition("://")
    if sep:
        if scheme.lower() not in ("http", "https"):
            raise ValueError(f"{where}: unsupported scheme {scheme!r} (only http and https)")
        rest = after
    host, _, path = rest.partition("/")
    path = f"/{path}"
    if path.startswith(("/v1/", "/v2/")):
        path = path[3:]
    path = "/".join(part for part in path.split("/") if part not in ("", "."))
    host = host.lower()
    if not host or not _KEY_HOST_RE.fullmatch(host):
        raise ValueError(f"{where}: {host!r} is not a registry host[:port]")
    if host in _HUB_ALIASES:
        host = DOCKER_HUB
    return host, path


def _decode_auth(value: str, where: str) -> tuple[str, str]:
    padded = value + "=" * (-len(value) % 4)
    try:
        decoded = base64.b64decode(padded, validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise ValueError(f"{where}.auth is not base64 of UTF-8 'username:password'") from None
    username, sep, password = decoded.partition(":")
    if not sep:
        raise ValueError(f"{where}.auth does not decode to 'username:password' (no ':')")
    return username, password


def _json_type(value: object) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case _:
            return "an object"


# ------------------------------------------------- the string form of RunAction.credentials (old peers)
# Agents and hubs built before RunAction.registry_credentials (the Hello capability
# nodetask.registry_credentials.TYPED_CREDENTIALS) carry each image's credentials as this JSON string: a hub
# encodes them for an agent that does not advertise the capability, and an agent decodes them from
# a hub that sends only these. Nothing else uses this form; it goes once no such peer is left.

_WIRE_FIELDS = ("registry", "username", "password", "identity_token", "registry_token")


def encode_credentials(auth: RegistryAuth) -> str:
    """One image's credentials in the string form of ``RunAction.credentials`` (JSON, snake_case keys)."""
    return json.dumps({name: getattr(auth, name) for name in _WIRE_FIELDS if getattr(auth, name)})


def decode_credentials(text: str) -> RegistryAuth:
    """The inverse of :func:`encode_credentials`. Errors: :class:`ValueError` naming what is wrong."""
    try:
        nesting.check_json(text)
        fields = json.loads(text)
    except nesting.NestingError as exc:
        raise ValueError(f"credentials are {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"credentials are not JSON: {exc.msg}") from None
    if not isinstance(fields, dict) or not all(isinstance(v, str) for v in fields.values()):
        raise ValueError("credentials must be a JSON object of strings")
    unknown = set(fields) - set(_WIRE_FIELDS)
    if unknown or "registry" not in fields:
        raise ValueError(f"credentials have unknown fields {sorted(unknown)} or no registry")
    return RegistryAuth(**fields)


def credentials_of(run: RunAction) -> tuple[dict[str, RegistryAuth], str]:
    """The credentials ``run`` carries by image, in whichever form its hub sent them, and the hub's
    reason when it had none (``credentials_error``).

    A string that does not decode (no hub encodes one) becomes the reason, naming its image: the
    job's pulls fail with it rather than going anonymous.
    """
    auths = dict(run.registry_credentials)
    for image, text in run.credentials.items():
        if image in auths:
            continue
        try:
            auths[image] = decode_credentials(text)
        except ValueError as exc:
            return {}, f"the hub's credentials for {image}: {exc}"
    return auths, run.credentials_error
