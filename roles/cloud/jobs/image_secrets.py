"""Registry credentials for a job's images, from the ``.dockerconfigjson`` Secret its ``imageSecrets`` names.

The Secret is read only in the namespaces the hubs allow (``imageSecretNamespaces``): a job's author
need not be allowed to read Secrets, so naming one elsewhere is refused before any read. Only the
entry of each image's own registry is sent, and only to the job's nodes.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final

from roles.cloud.api import ObjectReader
from roles.common.registry_auth import DockerConfig, RegistryAuth, parse_docker_config_json
from roles.kube import ApiError, NotFound
from roles.kube.resources import SECRETS

__all__ = ["DOCKER_CONFIG_KEY", "ImageSecrets"]

DOCKER_CONFIG_KEY: Final = ".dockerconfigjson"


class ImageSecrets:
    """Reads image pull Secrets from the API, only in ``namespaces``."""

    def __init__(self, api: ObjectReader, *, namespaces: tuple[str, ...]) -> None:
        self._api = api
        self._namespaces = namespaces

    async def credentials(self, job: Any) -> tuple[dict[str, RegistryAuth], str]:
        """Each image's registry credentials from the job's ``imageSecrets``, or why there are none."""
        template = getattr(job.spec, "image_pre_pull_template", None)
        if template is None or not template.image_secrets:
            return {}, ""
        try:
            config = await self.docker_config(template.image_secrets)
            auths = {image: config.auth_for(image) for image in template.images}
        except ValueError as exc:
            return {}, f"imageSecrets {template.image_secrets}: {exc}"
        return {image: auth for image, auth in auths.items() if auth is not None}, ""

    async def docker_config(self, reference: str) -> DockerConfig:
        """The parsed ``.dockerconfigjson`` of Secret ``namespace/name``; ValueError says what is wrong."""
        namespace, _, name = reference.partition("/")
        if not namespace or not name:
            raise ValueError("not of the form namespace/name")
        if namespace not in self._namespaces:
            # Refused before any read: the job's author need not be allowed to read that Secret.
            raise ValueError(
                f"the hubs read image secrets only in {', '.join(self._namespaces) or 'no namespace'}"
                " (their imageSecretNamespaces setting)"
            )
        try:
            secret = await self._api.get(SECRETS, name, namespace=namespace)
        except NotFound:
            raise ValueError("no such Secret") from None
        except ApiError as exc:
            raise ValueError(f"cannot be read: {exc}") from None
        try:
            return parse_docker_config_json(base64.b64decode(secret.data.get(DOCKER_CONFIG_KEY, ""), validate=True))
        except binascii.Error as exc:
            raise ValueError(f"{DOCKER_CONFIG_KEY} is not base64: {exc}") from None
