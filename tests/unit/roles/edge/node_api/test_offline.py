"""What a kubelet is answered while the cloud is unreachable: the cache's objects, and YurtHub's answers to writes."""

from __future__ import annotations

import msgspec
import structlog

from roles.common.httpserver import Request
from roles.edge.cache.view import MemoryCache
from roles.edge.local_api.local_api import LocalApi
from roles.edge.node_api.offline import OfflineAnswers

NODE = "edge-1"


def _answers() -> OfflineAnswers:
    cache = MemoryCache()
    cache.put("Node", {"metadata": {"name": NODE, "resourceVersion": "4"}, "status": {"phase": "Running"}})
    cache.put(
        "Lease",
        {
            "metadata": {"name": NODE, "namespace": "kube-node-lease", "resourceVersion": "5"},
            "spec": {"holderIdentity": NODE},
        },
    )
    cache.put("Secret", {"metadata": {"name": "key", "namespace": "ns", "resourceVersion": "6"}, "data": {"k": "dg=="}})
    log = structlog.get_logger()
    return OfflineAnswers(cache, LocalApi(cache, serve_secrets=True, log=log), log=log)


def _request(method: str, path: str, body: bytes = b"", content_type: str = "application/json") -> Request:
    headers = (("host", "127.0.0.1:10262"), ("content-type", content_type))
    return Request(method=method, path=path, query="", headers=headers, body=body)


async def test_reads_are_answered_from_the_cache_status_subresource_included() -> None:
    """The node, got directly or through its status, comes from the cache; Secrets too (the pods need them)."""
    answers = _answers()
    for path in (f"/api/v1/nodes/{NODE}", f"/api/v1/nodes/{NODE}/status"):
        answer = await answers.answer(_request("GET", path), "no hub")
        assert answer.status == 200
        assert msgspec.json.decode(answer.body)["metadata"]["name"] == NODE
    secret = await answers.answer(_request("GET", "/api/v1/namespaces/ns/secrets/key"), "no hub")
    assert secret.status == 200


async def test_updates_and_patches_get_the_cached_object_unchanged() -> None:
    """A lease renewal or a status patch is answered with the object as cached, its change not applied."""
    answers = _answers()
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
    renewed = await answers.answer(_request("PUT", path, b'{"spec":{"renewTime":"later"}}'), "no hub")
    assert renewed.status == 200
    lease = msgspec.json.decode(renewed.body)
    assert (lease["kind"], lease["apiVersion"], lease["spec"]) == (
        "Lease",
        "coordination.k8s.io/v1",
        {"holderIdentity": NODE},
    )
    patched = await answers.answer(_request("PATCH", f"/api/v1/nodes/{NODE}/status", b"{}"), "no hub")
    assert msgspec.json.decode(patched.body)["metadata"]["resourceVersion"] == "4"


async def test_a_create_gets_its_own_body_back_and_a_delete_a_forbidden_success() -> None:
    """As YurtHub: a create echoes its body with 201 (its content type kept), a delete is a Success saying Forbidden."""
    answers = _answers()
    event = b"k8s\x00protobuf event"
    created = await answers.answer(
        _request("POST", "/api/v1/namespaces/default/pods", event, "application/vnd.kubernetes.protobuf"), "no hub"
    )
    assert (created.status, created.body, created.content_type) == (201, event, "application/vnd.kubernetes.protobuf")
    deleted = await answers.answer(_request("DELETE", "/api/v1/namespaces/ns/pods/web"), "no hub")
    status = msgspec.json.decode(deleted.body)
    assert (deleted.status, status["status"], status["reason"]) == (200, "Success", "Forbidden")


async def test_what_the_cache_never_held_is_a_404_or_a_503_to_retry_never_made_up() -> None:
    """An object of a kept kind never cached is a 404; a path the device never keeps is a 503 with Retry-After."""
    answers = _answers()
    missing = await answers.answer(_request("PUT", "/api/v1/namespaces/ns/pods/ghost", b"{}"), "no hub")
    assert missing.status == 404
    got = await answers.answer(_request("GET", "/api/v1/namespaces/ns/pods/ghost"), "no hub")
    assert got.status == 404
    other = await answers.answer(_request("GET", "/apis/storage.k8s.io/v1/csidrivers"), "no hub")
    assert other.status == 503
    assert ("retry-after", "1") in other.headers
    assert "no hub" in msgspec.json.decode(other.body)["message"]
