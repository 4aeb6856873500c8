"""The asyncio side of the bridge: raw HTTP to the API server over kubernetes-asyncio's session.

Requests and responses stay bytes, encoded and decoded by msgspec; kubernetes-asyncio contributes
what it does well - kubeconfig and in-cluster configuration, TLS and client certificates, token
refresh through exec plugins - and its generated models are not used. Nothing here imports trio.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from yarl import URL

from roles.kube.errors import KubeconfigError, Unreachable, from_response
from roles.kube.resources import JSON

MERGE_PATCH = "application/merge-patch+json"


class AioApi:
    """HTTP to one API server. Create and use it only inside the asyncio loop."""

    def __init__(self, api_client: k8s_client.ApiClient) -> None:
        self._client = api_client
        self.host: str = api_client.configuration.host or ""
        self.ca_file: str = api_client.configuration.ssl_ca_cert or ""
        """The CA bundle the API server is verified with (a file the configuration loader wrote, for a
        kubeconfig's certificate-authority-data); empty: the system's roots."""
        # kubernetes-asyncio's session trusts the environment, which costs aiohttp two thread hops a
        # request (a netrc read and a proxy lookup): a sixth of a hub's CPU in a connect storm. This
        # session shares its connector (TLS, client certificates, pool) and looks the proxy up once.
        pool: aiohttp.ClientSession = api_client.rest_client.pool_manager
        self._session = aiohttp.ClientSession(connector=pool.connector, connector_owner=False, read_bufsize=2**21)
        self._proxy, self._proxy_auth = _proxy_for(self.host, api_client.configuration.proxy)

    @classmethod
    async def connect(cls, kubeconfig: str, context: str = "") -> AioApi:
        """Configuration from ``kubeconfig`` (its ``context``, else its current one), or from the pod's service
        account when empty."""
        cfg = k8s_client.Configuration()
        _require_file(kubeconfig)
        if context and not kubeconfig:
            raise KubeconfigError(f"--context {context!r} needs a kubeconfig: this is the pod's ServiceAccount")
        try:
            if kubeconfig:
                await k8s_config.load_kube_config(
                    config_file=kubeconfig, context=context or None, client_configuration=cfg
                )
            else:
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        except Exception as exc:  # the loader raises whatever its parsers do: each means a bad file
            raise KubeconfigError(_kubeconfig_problem(kubeconfig, exc)) from None
        return cls(k8s_client.ApiClient(cfg))

    async def close(self) -> None:
        await self._session.close()
        await self._client.close()

    async def _headers(self, content_type: str, accept: str) -> dict[str, str]:
        headers = {"Accept": accept, "Content-Type": content_type, **self._client.default_headers}
        await self._client.update_params_for_auth(headers, [], ["BearerToken"])
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, str] | None = None,
        body: bytes | None = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout_s: float = 30.0,
        what: str = "",
    ) -> bytes:
        """One request; the response body on 2xx, else the matching :class:`ApiError`."""
        headers = await self._headers(content_type, accept)
        try:
            async with self._session.request(
                method,
                self.host + path,
                params=query,
                data=body,
                headers=headers,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                data = await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise_if_cancelling()
            raise Unreachable(0, type(exc).__name__, str(exc) or "no answer", what=what or f"{method} {path}") from None
        if resp.status >= 300:
            raise from_response(resp.status, data, what=what or f"{method} {path}")
        return data

    async def stream(
        self,
        path: str,
        *,
        query: dict[str, str],
        read_timeout: float,
        on_line: Callable[[bytes], None],
        accept: str = JSON,
    ) -> None:
        """Feed each line of a streaming GET (a watch) to ``on_line`` until the server ends it.

        A callback rather than an async generator on purpose: an asyncio async generator suspended
        when its task is cancelled can be left unfinalised under trio-asyncio, wedging the task.
        """
        headers = await self._headers(JSON, accept)
        try:
            resp = await self._session.get(
                self.host + path,
                params=query,
                headers=headers,
                proxy=self._proxy,
                proxy_auth=self._proxy_auth,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=read_timeout),
            )
            try:
                if resp.status >= 300:
                    raise from_response(resp.status, await resp.read(), what=f"watch {path}")
                pending = b""
                while chunk := await resp.content.readany():
                    # Lines can exceed aiohttp's readline limit (a job object may approach 1 MiB).
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line:
                            on_line(line)
            finally:
                # A half-read watch connection can never go back to the pool. Abort it: a graceful
                # TLS close waits for the peer (up to 30 s) and keeps the socket open meanwhile.
                protocol = resp.connection.protocol if resp.connection is not None else None
                transport = protocol.transport if protocol is not None else None
                if transport is not None:
                    transport.abort()
                resp.close()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise_if_cancelling()
            raise Unreachable(0, type(exc).__name__, str(exc) or "connection lost", what=f"watch {path}") from None


def _proxy_for(host: str, configured: str | None) -> tuple[str | None, aiohttp.BasicAuth | None]:
    """The proxy to reach ``host`` through: the kubeconfig's ``proxy-url``, else ``HTTPS_PROXY``/``HTTP_PROXY``
    unless ``NO_PROXY`` exempts the host (as kubectl reads them), else none."""
    if configured:
        return configured, None
    try:
        proxy, auth = get_env_proxy_for_url(URL(host))
    except (LookupError, ValueError):
        return None, None
    return str(proxy), auth


def raise_if_cancelling() -> None:
    """Re-raise cancellation that aiohttp turned into another error.

    aiohttp's timeout context converts a task's CancelledError into TimeoutError; treating that as a
    network error would retry forever in a task that trio is waiting to see finish.
    """
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def log_asyncio_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any], *, log: Any) -> None:
    """Loop exception handler: the default one re-raises, and one stray aiohttp warning kills the process."""
    exc = context.get("exception")
    log.warning("asyncio_error", message=context.get("message", ""), error=repr(exc) if exc else "")


def _require_file(kubeconfig: str) -> None:
    """Refuse a kubeconfig that does not exist before the loader logs a line of its own about it."""
    if kubeconfig and not Path(kubeconfig).exists():
        raise KubeconfigError(f"kubeconfig {kubeconfig} does not exist")


def _kubeconfig_problem(kubeconfig: str, exc: Exception) -> str:
    """One line naming why the configuration could not be loaded (the loaders' own messages span lines)."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if not kubeconfig:
        return f"no kubeconfig was given, and this is not a pod with a ServiceAccount ({detail})"
    if isinstance(exc, OSError):
        return f"cannot read kubeconfig {kubeconfig}: {exc.strerror or detail}"
    if isinstance(exc, TypeError | AttributeError | KeyError | IndexError):  # YAML, but not shaped as one
        return f"kubeconfig {kubeconfig} is not a kubeconfig (a mapping of clusters, users and contexts): {detail}"
    return f"kubeconfig {kubeconfig} is not usable: {detail}"
