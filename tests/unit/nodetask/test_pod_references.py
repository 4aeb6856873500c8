"""The ConfigMaps and Secrets a Pod references, as Kubernetes' Node authorizer finds them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.pod_references import PodReferences, decode_spec, pod_references


def _refs(spec: dict[str, Any]) -> PodReferences:
    return pod_references(decode_spec(msgspec.json.encode(spec)))


def _container(**fields: Any) -> dict[str, Any]:
    return {"name": "c", "image": "i", **fields}


# Where a name can sit in a Pod spec, by kind: each builds a spec referencing `name` there.
Place = Callable[[str], dict[str, Any]]
SECRET_PLACES: dict[str, Place] = {
    "imagePullSecrets": lambda n: {"imagePullSecrets": [{"name": n}]},
    "envFrom.secretRef": lambda n: {"containers": [_container(envFrom=[{"secretRef": {"name": n}}])]},
    "env.secretKeyRef": lambda n: {
        "containers": [_container(env=[{"name": "E", "valueFrom": {"secretKeyRef": {"name": n, "key": "k"}}}])]
    },
    "initContainers": lambda n: {"initContainers": [_container(envFrom=[{"secretRef": {"name": n}}])]},
    "ephemeralContainers": lambda n: {"ephemeralContainers": [_container(envFrom=[{"secretRef": {"name": n}}])]},
    "volume.secret": lambda n: {"volumes": [{"name": "v", "secret": {"secretName": n}}]},
    "volume.projected": lambda n: {"volumes": [{"name": "v", "projected": {"sources": [{"secret": {"name": n}}]}}]},
    "volume.azureFile": lambda n: {"volumes": [{"name": "v", "azureFile": {"secretName": n, "shareName": "s"}}]},
    "volume.cephfs": lambda n: {"volumes": [{"name": "v", "cephfs": {"monitors": ["m"], "secretRef": {"name": n}}}]},
    "volume.cinder": lambda n: {"volumes": [{"name": "v", "cinder": {"volumeID": "x", "secretRef": {"name": n}}}]},
    "volume.flexVolume": lambda n: {
        "volumes": [{"name": "v", "flexVolume": {"driver": "d", "secretRef": {"name": n}}}]
    },
    "volume.rbd": lambda n: {"volumes": [{"name": "v", "rbd": {"image": "i", "secretRef": {"name": n}}}]},
    "volume.scaleIO": lambda n: {"volumes": [{"name": "v", "scaleIO": {"system": "s", "secretRef": {"name": n}}}]},
    "volume.iscsi": lambda n: {"volumes": [{"name": "v", "iscsi": {"iqn": "q", "secretRef": {"name": n}}}]},
    "volume.storageos": lambda n: {"volumes": [{"name": "v", "storageos": {"secretRef": {"name": n}}}]},
    "volume.csi": lambda n: {"volumes": [{"name": "v", "csi": {"driver": "d", "nodePublishSecretRef": {"name": n}}}]},
}
CONFIG_MAP_PLACES: dict[str, Place] = {
    "envFrom.configMapRef": lambda n: {"containers": [_container(envFrom=[{"configMapRef": {"name": n}}])]},
    "env.configMapKeyRef": lambda n: {
        "containers": [_container(env=[{"name": "E", "valueFrom": {"configMapKeyRef": {"name": n, "key": "k"}}}])]
    },
    "initContainers": lambda n: {"initContainers": [_container(envFrom=[{"configMapRef": {"name": n}}])]},
    "volume.configMap": lambda n: {"volumes": [{"name": "v", "configMap": {"name": n}}]},
    "volume.projected": lambda n: {"volumes": [{"name": "v", "projected": {"sources": [{"configMap": {"name": n}}]}}]},
}


@pytest.mark.parametrize("place", sorted(SECRET_PLACES))
def test_each_place_the_node_authorizer_follows_for_secrets_is_found(place: str) -> None:
    """A Secret named in any place the Node authorizer follows is a reference, and nothing else is."""
    assert _refs(SECRET_PLACES[place]("s1")) == PodReferences(secrets=("s1",))


@pytest.mark.parametrize("place", sorted(CONFIG_MAP_PLACES))
def test_each_place_the_node_authorizer_follows_for_config_maps_is_found(place: str) -> None:
    """A ConfigMap named in any place the Node authorizer follows is a reference."""
    assert _refs(CONFIG_MAP_PLACES[place]("c1")) == PodReferences(config_maps=("c1",))


def test_names_elsewhere_and_empty_names_are_not_references() -> None:
    """A PVC, a service account, a downward-API or plain env value and empty names reference nothing."""
    spec = {
        "nodeName": "n0",
        "serviceAccountName": "sa",
        "containers": [_container(env=[{"name": "E", "value": "s1"}, {"name": "F", "valueFrom": {"fieldRef": {}}}])],
        "volumes": [
            {"name": "a", "persistentVolumeClaim": {"claimName": "s1"}},
            {"name": "b", "secret": {}},
            {"name": "c", "configMap": {"name": ""}},
            {"name": "d", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
            {"name": "e", "emptyDir": {}},
        ],
    }
    assert _refs(spec) == PodReferences()


def test_the_node_name_is_read() -> None:
    """The view of a spec carries the node it is bound to."""
    assert decode_spec(b'{"nodeName": "edge-1", "schedulerName": "x"}').node_name == "edge-1"


names = st.text(alphabet="abc-1", min_size=1, max_size=6)


@given(
    secrets=st.lists(st.tuples(st.sampled_from(sorted(SECRET_PLACES)), names), max_size=6),
    config_maps=st.lists(st.tuples(st.sampled_from(sorted(CONFIG_MAP_PLACES)), names), max_size=6),
)
def test_every_name_placed_anywhere_is_found_and_no_other(
    secrets: list[tuple[str, str]], config_maps: list[tuple[str, str]]
) -> None:
    """Names spread over any mix of places come back exactly, each under its kind."""
    spec: dict[str, list[Any]] = {}
    for places, chosen in ((SECRET_PLACES, secrets), (CONFIG_MAP_PLACES, config_maps)):
        for place, name in chosen:
            for field, items in places[place](name).items():
                spec.setdefault(field, []).extend(items)
    assert _refs(spec) == PodReferences(
        config_maps=tuple(sorted({n for _, n in config_maps})), secrets=tuple(sorted({n for _, n in secrets}))
    )
