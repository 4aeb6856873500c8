"""The container image reference grammar (``distribution/reference``'s regexp.go), written once.

The admission rules check a pre-pull image against :data:`REFERENCE` (:func:`schemas.validation.is_image_reference`);
the parse that normalises an image and matches its registry's credentials checks each part against the
others (``roles.common.registry_auth.parse_image``). Go's ``\\w`` is ASCII-only and its ``$`` is the
true end, hence ``re.ASCII`` and ``fullmatch``. KubeEdge's own, narrower upgrade-image rule is not
this grammar and stays with the node jobs' rules.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["DIGEST", "DOMAIN", "IMAGE_ID", "PATH", "REFERENCE", "TAG"]

_PATH_COMPONENT: Final = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN_COMPONENT: Final = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST: Final = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_DOMAIN: Final = rf"{_HOST}(?::[0-9]+)?"
_PATH: Final = rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
_TAG: Final = r"[\w][\w.-]{0,127}"
_DIGEST: Final = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"

DOMAIN: Final = re.compile(_DOMAIN, re.ASCII)
"""A registry host, a DNS name or a bracketed IPv6 address, with an optional port."""
PATH: Final = re.compile(_PATH, re.ASCII)
"""A repository path: lowercase components joined by ``/``."""
TAG: Final = re.compile(_TAG, re.ASCII)
"""A tag: at most 128 characters, not starting with ``.`` or ``-``."""
DIGEST: Final = re.compile(_DIGEST, re.ASCII)
"""A digest: ``algorithm:hex`` with at least 32 hex digits."""
IMAGE_ID: Final = re.compile(r"[0-9a-f]{64}", re.ASCII)
"""A bare image ID, which a reference must not be."""
REFERENCE: Final = re.compile(rf"(?:{_DOMAIN}/)?{_PATH}(?::{_TAG})?(?:@{_DIGEST})?", re.ASCII)
"""A whole reference: ``[domain/]path[:tag][@digest]``; a bare ``busybox:latest`` is one."""
