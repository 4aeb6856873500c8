"""Registry credentials as a RunAction carries them to an edge, and the capability of agents that read them typed.

Secrets are kept out of ``repr``: an accidental log line or a traceback's locals show only who, not how.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

__all__ = ["TYPED_CREDENTIALS", "RegistryAuth"]


class RegistryAuth(msgspec.Struct, frozen=True, omit_defaults=True, rename="camel"):
    """Credentials for one registry, as the CRI ``AuthConfig`` carries them.

    The one type from the hub's parse of a ``.dockerconfigjson`` Secret to the CRI call in the
    edge's puller child. Secrets are kept out of ``repr`` so that an accidental log line or a
    traceback's locals show only who, not how.
    """

    registry: str
    """The key of the Secret's ``auths`` entry these came from, as written there."""
    username: str = ""
    password: str = ""
    identity_token: str = ""
    registry_token: str = ""

    def __repr__(self) -> str:
        return f"RegistryAuth(registry={self.registry!r}, username={self.username!r})"

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return [("registry", self.registry), ("username", self.username)]


TYPED_CREDENTIALS: Final = "registryCredentials"
"""The Hello capability of an agent that reads :attr:`nodetask.messages.RunAction.registry_credentials`.

A hub sends that field only to agents advertising it and the string form (``credentials``) to the
others: agents built before it read only the strings and ignore the field they do not know.
"""
