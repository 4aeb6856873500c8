"""Retrying API calls through an outage, logged once per outage rather than once per try.

An API server that restarts answers, for a minute or so, with refused connections, 401s and 403s
(its authenticator and authorizer warming up), plain 404s (custom resources not yet served), 429s
and 5xx. Each of those is transient to a role: it waits, with backoff, and tries again. What an
operator needs to read is that it happened, and that it ended; not every try.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import anyio
import msgspec

from nodetask.backoff import Backoff
from roles.kube.errors import ApiError, NotFound
from roles.kube.resources import Resource

__all__ = ["Outage", "read_through_outage"]

T = TypeVar("T", bound=msgspec.Struct)


class _Reader(Protocol):
    async def get(self, resource: Resource[T], name: str, *, namespace: str = "") -> T: ...


class Outage:
    """The failures of one repeated API call since it last succeeded.

    :meth:`failed` counts a failure and gives the delay before the next try: the first failure of an
    outage is logged as a warning under ``event``, the later ones at debug level only.
    :meth:`recovered` logs ``api_recovered`` once if there were failures, and starts over. Both are
    synchronous, so the asyncio side of the bridge (the watch loops) uses them as the trio side does.
    """

    def __init__(self, log: Any, event: str, *, initial: float = 0.2, cap: float = 5.0) -> None:
        self._log = log
        self._event = event
        self._backoff = Backoff(initial=initial, cap=cap)
        self.failures = 0

    def failed(self, error: BaseException | str) -> float:
        """Count a failure; the seconds to wait before trying again."""
        delay = self._backoff.delay()
        self.noted(error, retry_in_s=round(delay, 2))
        return delay

    def noted(self, error: BaseException | str, **keys: object) -> None:
        """Count a failure that someone else retries (its delay is theirs to choose)."""
        self.failures += 1
        emit = self._log.warning if self.failures == 1 else self._log.debug
        emit(self._event, error=str(error), attempt=self.failures, **keys)

    async def wait(self, error: BaseException | str) -> None:
        """Count a failure and sleep through its backoff (trio side)."""
        await anyio.sleep(self.failed(error))

    def recovered(self) -> None:
        """The call succeeded: log the end of an outage, if there was one, and reset the backoff."""
        if self.failures:
            self._log.info("api_recovered", after=self._event, failures=self.failures)
        self.failures = 0
        self._backoff.reset()


async def read_through_outage(
    api: _Reader, resource: Resource[T], name: str, *, log: Any, event: str, namespace: str = ""
) -> T | None:
    """The object, read again through any outage (logged once under ``event``); None when it does not exist."""
    outage = Outage(log, event)
    while True:
        try:
            found = await api.get(resource, name, namespace=namespace)
        except NotFound:
            return None
        except ApiError as exc:
            await outage.wait(exc)
            continue
        outage.recovered()
        return found
