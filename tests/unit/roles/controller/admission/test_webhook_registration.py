"""Registering the webhooks patches the controller's own configurations first: RBAC grants it no create."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import msgspec
import pytest
import structlog

from roles.controller.admission.registration import CONFIGURATION_NAME, register_webhooks, webhook_configurations
from roles.kube import ApiError, Kube
from roles.kube.aio import AioApi
from roles.kube.errors import from_response

KINDS = {
    "validatingwebhookconfigurations": "ValidatingWebhookConfiguration",
    "mutatingwebhookconfigurations": "MutatingWebhookConfiguration",
}
PLURALS = tuple(KINDS)


class ApiServer:
    """Answers each request with the status ``answers`` gives its method (200 when none), echoing the body."""

    def __init__(self, answers: Mapping[str, int]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, *, body: bytes = b"", **_: Any) -> bytes:
        self.requests.append((method, path.rsplit("/admissionregistration.k8s.io/v1/", 1)[1]))
        status = self.answers.get(method, 200)
        if status >= 300:
            # The API server's Status body, as it answers for a missing object or a refused verb.
            reason = {404: "NotFound", 403: "Forbidden"}.get(status, "")
            raise from_response(
                status, msgspec.json.encode({"reason": reason, "code": status}), what=f"{method} {path}"
            )
        if method == "POST":
            return body
        kind = KINDS[path.split("/")[-2]]
        stored = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": CONFIGURATION_NAME},
        }
        return msgspec.json.encode(stored)


async def _direct(fn: Any, *args: Any, **kwargs: Any) -> Any:
    return await fn(*args, **kwargs)


async def _register(server: ApiServer) -> None:
    kube = Kube(cast("AioApi", server), log=structlog.get_logger(), cross=_direct)
    validating, mutating = webhook_configurations(url_base="https://127.0.0.1:9443", ca_bundle=b"PEM")
    await register_webhooks(kube, validating, mutating, log=structlog.get_logger())


async def test_existing_configurations_are_patched_and_nothing_is_created() -> None:
    """As shipped by the manifests, both configurations are brought up to date by a patch of their name alone."""
    server = ApiServer({})
    await _register(server)
    assert server.requests == [("PATCH", f"{plural}/{CONFIGURATION_NAME}") for plural in PLURALS]


async def test_missing_configurations_are_created_after_the_patch_finds_none() -> None:
    """Where nothing ships them (a controller outside the cluster), a 404 on the patch leads to a create."""
    server = ApiServer({"PATCH": 404})
    await _register(server)
    assert server.requests == [
        request for plural in PLURALS for request in (("PATCH", f"{plural}/{CONFIGURATION_NAME}"), ("POST", plural))
    ]


async def test_a_missing_configuration_the_controller_may_not_create_is_an_error_saying_what_to_do() -> None:
    """Without the create grant, the refusal is logged with the two ways out and ends the registration."""
    server = ApiServer({"PATCH": 404, "POST": 403})
    with structlog.testing.capture_logs() as logs, pytest.raises(ApiError) as refused:
        await _register(server)
    assert refused.value.status == 403
    (missing,) = [entry for entry in logs if entry["event"] == "webhook_configuration_missing"]
    assert missing["log_level"] == "error"
    assert "containers/deploy/webhooks.yaml" in missing["fix"]
    assert "containers/rbac/webhook-registration" in missing["fix"]
