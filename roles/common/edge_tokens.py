"""Where an edge's join token lives: the ``token`` key of Secret ``nodetaskd-edge-<node>`` in the token namespace.

Written by ``nodetaskd token create`` (:mod:`roles.cli.tokens`), checked by the hubs
(:mod:`roles.cloud.transport.auth`), and looked for by the controller's approver of node certificates: a node
with a token Secret is an edge node of nodetaskd's.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SECRET_PREFIX", "TOKEN_KEY", "TOKEN_LABEL", "token_secret_name"]

TOKEN_KEY: Final = "token"
TOKEN_LABEL: Final = "nodetask.kubeedge.io/edge-token"
"""Token Secrets carrying this label (any value) are watched instead of read one by one."""
SECRET_PREFIX: Final = "nodetaskd-edge-"


def token_secret_name(node: str) -> str:
    """The Secret that holds ``node``'s edge token."""
    return f"{SECRET_PREFIX}{node}"
