"""Keeps the node's client certificate issued while the node's API endpoint is on.

In every session with a hub that lists :data:`~nodetask.messages.NODE_CREDENTIALS_CAPABILITY`, the keeper
looks at the node's credentials (:func:`roles.edge.node_api.node_certificate.due`); when a certificate is due
it sends a :class:`~nodetask.messages.NodeCredentialsRequest` with a request made with the node's own key,
and keeps what the hub answers once it checks out (:func:`~roles.edge.node_api.node_certificate.accept`).
The endpoint reads the new files at its next connection (:class:`~roles.edge.node_api.credentials.CredentialFiles`).
Otherwise it looks again when the certificate it holds is due, and at least every hour (files put there
by hand).

A request that fails (the hub refused it or could not have it signed, its answer did not check out, no
answer came) is tried again after a capped, jittered backoff that outlives the session, so reconnecting
does not hurry it; each new reason is logged once, as a warning, and the retries that fail the same way
are not.
"""

from __future__ import annotations

import contextlib
import functools
import math
import secrets
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, final

import anyio
import anyio.abc
import structlog

from nodetask.backoff import Backoff
from nodetask.link import LinkClosed
from nodetask.messages import NodeCredentials, NodeCredentialsRequest, Upstream

__all__ = ["CertificateKeeper"]

Log = structlog.typing.FilteringBoundLogger

ANSWER_TIMEOUT_S: Final = 180.0
"""How long an answer is waited for: the hub waits for the signature for a bounded time, then answers."""
RECHECK_S: Final = 3600.0
"""A certificate that is not due is looked at again at least this often."""
FIRST_RETRY_S: Final = 10.0
RETRY_CAP_S: Final = 900.0


class _Failed(Exception):
    """A request for the certificate failed; the message says why."""


def _wall_clock() -> datetime:
    return datetime.now(UTC)


@final
class CertificateKeeper:
    """The node's certificate in ``directory``, asked for through the hub sessions (:meth:`serve_session`)."""

    def __init__(
        self,
        directory: Path,
        node: str,
        *,
        log: Log,
        now: Callable[[], datetime] = _wall_clock,
        answer_timeout: float = ANSWER_TIMEOUT_S,
        first_retry: float = FIRST_RETRY_S,
    ) -> None:
        """``now`` is the wall clock (certificates are valid by it, not by the event loop's clock)."""
        self._directory = directory
        self._node = node
        self._log = log
        self._now = now
        self._answer_timeout = answer_timeout
        self._backoff = Backoff(initial=first_retry, cap=RETRY_CAP_S)
        self._retry_at = -math.inf
        """Loop time before which no request is sent (after a failure)."""
        self._failure = ""
        """The reason of the last failure logged; empty once a certificate was kept."""
        self._waiting: tuple[str, anyio.Event, list[NodeCredentials]] | None = None
        """The id of the request in flight, the event its answer sets, and where the answer goes."""
        self.issued = 0
        """Certificates kept since the agent started."""

    def handle(self, msg: NodeCredentials) -> None:
        """The hub's answer: handed to the request it answers (any other is dropped)."""
        waiting = self._waiting
        if waiting is None or waiting[0] != msg.id:
            self._log.info("node_credentials_unasked", id=msg.id)
            return
        waiting[2].append(msg)
        waiting[1].set()

    async def serve_session(
        self, send: Callable[[Upstream], Awaitable[None]], *, task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        """Keep the certificate through this session until it ends (cancelled, or its link closes)."""
        from roles.edge.node_api import node_certificate  # noqa: PLC0415 (loads cryptography: deferred)

        task_status.started()
        with contextlib.suppress(LinkClosed):
            while True:
                await anyio.sleep_until(self._retry_at)
                state = await anyio.to_thread.run_sync(node_certificate.due, self._directory, self._node, self._now())
                if state.renew_at is not None:
                    wait = (state.renew_at - self._now()).total_seconds()
                    await anyio.sleep(min(RECHECK_S, max(wait, 0.0)))
                    continue
                if not self._failure:
                    self._log.info("node_certificate_requested", reason=state.reason)
                try:
                    renew_at = await self._renew(send)
                except _Failed as exc:
                    self._failed(str(exc))
                    continue
                self.issued += 1
                self._backoff.reset()
                self._failure = ""
                self._log.info("node_certificate_kept", directory=str(self._directory), renew_at=renew_at.isoformat())

    def _failed(self, reason: str) -> None:
        delay = self._backoff.delay()
        self._retry_at = anyio.current_time() + delay
        if reason != self._failure:
            self._failure = reason
            self._log.warning("node_certificate_failed", error=reason, retry_in=round(delay, 1))

    async def _renew(self, send: Callable[[Upstream], Awaitable[None]]) -> datetime:
        """Ask for a certificate and keep it; when it is due. Errors: :class:`_Failed` saying why not."""
        from roles.edge.node_api import node_certificate  # noqa: PLC0415 (loads cryptography: deferred)

        try:
            key, made = await anyio.to_thread.run_sync(node_certificate.node_key, self._directory)
        except OSError as exc:
            raise _Failed(f"cannot keep the node's key in {self._directory}: {exc.strerror or exc}") from None
        if made:
            self._log.info("node_key_made", path=str(self._directory / "node.key"))
        csr = await anyio.to_thread.run_sync(node_certificate.request_pem, key, self._node)
        request = NodeCredentialsRequest(id=secrets.token_hex(8), csr=csr)
        answered, answers = anyio.Event(), list[NodeCredentials]()
        self._waiting = (request.id, answered, answers)
        try:
            await send(request)
            with anyio.move_on_after(self._answer_timeout):
                await answered.wait()
        finally:
            self._waiting = None
        if not answers:
            raise _Failed(f"the hub did not answer within {self._answer_timeout:g} s")
        answer = answers[0]
        if answer.error:
            raise _Failed(f"the hub could not have the certificate issued: {answer.error}")
        accept = functools.partial(
            node_certificate.accept,
            self._directory,
            self._node,
            key,
            certificate=answer.certificate,
            ca_bundle=answer.ca_bundle,
            now=self._now(),
        )
        try:
            return await anyio.to_thread.run_sync(accept)
        except node_certificate.IssuedError as exc:
            raise _Failed(f"what the hub sent is not kept: {exc}") from None
        except OSError as exc:
            raise _Failed(f"cannot write the certificate into {self._directory}: {exc.strerror or exc}") from None
