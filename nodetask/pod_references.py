"""Which ConfigMaps and Secrets a Pod references: what Kubernetes' Node authorizer lets its node read.

The Node authorizer (``plugin/pkg/auth/authorizer/node``) lets a kubelet read the ConfigMaps and
Secrets of the Pods bound to its node, found by ``podutil.VisitPodConfigmapNames`` and
``VisitPodSecretNames`` over every container (init, regular and ephemeral). Followed here, all in the
Pod's own namespace, empty names skipped:

* Secrets: ``imagePullSecrets``; each container's ``envFrom[].secretRef`` and
  ``env[].valueFrom.secretKeyRef``; volumes ``secret.secretName``, ``projected.sources[].secret``,
  ``azureFile.secretName`` and the ``secretRef`` of ``cephfs``, ``cinder``, ``flexVolume``, ``rbd``,
  ``scaleIO``, ``iscsi``, ``storageos``, and ``csi.nodePublishSecretRef``;
* ConfigMaps: each container's ``envFrom[].configMapRef`` and ``env[].valueFrom.configMapKeyRef``;
  volumes ``configMap.name`` and ``projected.sources[].configMap``.

Not followed (the cache holds none of these kinds): the authorizer's transitive edges Pod → PVC →
PV → Secret, Pod → ServiceAccount, Pod → ResourceClaim.

Only the fields read are typed; everything else of a Pod spec is ignored when decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import msgspec

__all__ = ["CONFIG_MAP", "SECRET", "PodReferences", "PodSpecRefs", "decode_spec", "pod_references"]

CONFIG_MAP: Final = "ConfigMap"
SECRET: Final = "Secret"


class _View(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Base of the views: Kubernetes' JSON keys, unknown fields ignored."""


class _Named(_View, frozen=True):
    name: str = ""


class _SecretVolume(_View, frozen=True):
    secret_name: str = ""


class _SecretRefd(_View, frozen=True):
    """A volume source whose Secret is ``secretRef.name``."""

    secret_ref: _Named | None = None


class _Csi(_View, frozen=True):
    node_publish_secret_ref: _Named | None = None


class _Projection(_View, frozen=True):
    config_map: _Named | None = None
    secret: _Named | None = None


class _Projected(_View, frozen=True):
    sources: tuple[_Projection, ...] | None = None


class _Volume(_View, frozen=True):
    config_map: _Named | None = None
    secret: _SecretVolume | None = None
    projected: _Projected | None = None
    azure_file: _SecretVolume | None = None
    cephfs: _SecretRefd | None = None
    cinder: _SecretRefd | None = None
    flex_volume: _SecretRefd | None = None
    rbd: _SecretRefd | None = None
    scale_io: _SecretRefd | None = msgspec.field(default=None, name="scaleIO")
    iscsi: _SecretRefd | None = None
    storageos: _SecretRefd | None = None
    csi: _Csi | None = None


class _EnvSource(_View, frozen=True):
    config_map_ref: _Named | None = None
    secret_ref: _Named | None = None


class _KeyRefs(_View, frozen=True):
    config_map_key_ref: _Named | None = None
    secret_key_ref: _Named | None = None


class _EnvVar(_View, frozen=True):
    value_from: _KeyRefs | None = None


class _Container(_View, frozen=True):
    env: tuple[_EnvVar, ...] | None = None
    env_from: tuple[_EnvSource, ...] | None = None


class PodSpecRefs(_View, frozen=True):
    """The parts of a Pod's spec that bind it to a node and name its ConfigMaps and Secrets."""

    node_name: str = ""
    containers: tuple[_Container, ...] | None = None
    init_containers: tuple[_Container, ...] | None = None
    ephemeral_containers: tuple[_Container, ...] | None = None
    volumes: tuple[_Volume, ...] | None = None
    image_pull_secrets: tuple[_Named, ...] | None = None


_DECODER: Final = msgspec.json.Decoder(PodSpecRefs)


def decode_spec(spec: bytes | msgspec.Raw) -> PodSpecRefs:
    """A Pod's ``spec`` (its JSON) as :class:`PodSpecRefs`. Errors: ``msgspec.DecodeError`` naming the field."""
    return _DECODER.decode(spec)


@dataclass(frozen=True, slots=True, weakref_slot=True)
class PodReferences:
    """The names of the ConfigMaps and Secrets one Pod references (in its namespace), each sorted.

    Tuples rather than sets: a hub keeps one of these per Pod of every connected node, and a Pod
    references a few names (a tuple of one is a quarter of a set's size). Weakly referable, so that
    a holder can share equal ones.
    """

    config_maps: tuple[str, ...] = ()
    secrets: tuple[str, ...] = ()

    def keys(self) -> Iterator[tuple[str, str]]:
        """Each reference as ``(kind, name)``."""
        for name in self.config_maps:
            yield CONFIG_MAP, name
        for name in self.secrets:
            yield SECRET, name


NONE: Final = PodReferences()


def _containers(spec: PodSpecRefs) -> Iterator[_Container]:
    for group in (spec.init_containers, spec.containers, spec.ephemeral_containers):
        yield from group or ()


def _volume_secrets(volume: _Volume) -> Iterator[str]:
    if volume.secret is not None:
        yield volume.secret.secret_name
    if volume.azure_file is not None:
        yield volume.azure_file.secret_name
    for source in (
        volume.cephfs,
        volume.cinder,
        volume.flex_volume,
        volume.rbd,
        volume.scale_io,
        volume.iscsi,
        volume.storageos,
    ):
        if source is not None and source.secret_ref is not None:
            yield source.secret_ref.name
    if volume.csi is not None and volume.csi.node_publish_secret_ref is not None:
        yield volume.csi.node_publish_secret_ref.name
    for projection in (volume.projected.sources or ()) if volume.projected is not None else ():
        if projection.secret is not None:
            yield projection.secret.name


def _volume_config_maps(volume: _Volume) -> Iterator[str]:
    if volume.config_map is not None:
        yield volume.config_map.name
    for projection in (volume.projected.sources or ()) if volume.projected is not None else ():
        if projection.config_map is not None:
            yield projection.config_map.name


def pod_references(spec: PodSpecRefs) -> PodReferences:
    """The ConfigMaps and Secrets ``spec`` references, by the module's rules. Pure."""
    config_maps: set[str] = set()
    secrets = {ref.name for ref in spec.image_pull_secrets or ()}
    for container in _containers(spec):
        for source in container.env_from or ():
            if source.config_map_ref is not None:
                config_maps.add(source.config_map_ref.name)
            if source.secret_ref is not None:
                secrets.add(source.secret_ref.name)
        for var in container.env or ():
            refs = var.value_from
            if refs is None:
                continue
            if refs.config_map_key_ref is not None:
                config_maps.add(refs.config_map_key_ref.name)
            if refs.secret_key_ref is not None:
                secrets.add(refs.secret_key_ref.name)
    for volume in spec.volumes or ():
        config_maps.update(_volume_config_maps(volume))
        secrets.update(_volume_secrets(volume))
    config_maps.discard("")
    secrets.discard("")
    if not config_maps and not secrets:
        return NONE
    return PodReferences(tuple(sorted(config_maps)), tuple(sorted(secrets)))
