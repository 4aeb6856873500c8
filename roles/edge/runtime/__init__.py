"""The edge's container runtime: image pulls through CRI, and the registry credentials they use."""

from __future__ import annotations

from nodetask.registry_auth import DockerConfig, RegistryAuth, parse_docker_config_json, parse_image
from roles.edge.runtime.cri import (
    PULL_FAILED_REASON,
    CriError,
    ImageInfo,
    ImagePuller,
    ImageService,
    open_image_service,
    pull_images,
)

__all__ = [
    "PULL_FAILED_REASON",
    "CriError",
    "DockerConfig",
    "ImageInfo",
    "ImagePuller",
    "ImageService",
    "RegistryAuth",
    "open_image_service",
    "parse_docker_config_json",
    "parse_image",
    "pull_images",
]
