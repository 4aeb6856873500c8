"""The edge role's wiring: settings from the configuration, the store, the actions and the agent.

Kept out of the package's ``__init__`` so that importing any part of :mod:`roles.edge` (the
launcher above all, which runs for as long as the device does) does not load the whole agent.
"""

from __future__ import annotations

import contextlib
import functools
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

import anyio
import anyio.abc
import structlog

from nodetask.clock import Clock
from nodetask.registry_credentials import RegistryAuth
from roles.common.config import ConfigError, EdgeConfig, RoleConfig
from roles.common.jobtypes import edge_job_types
from roles.edge.actions import AuthFor, PullImages, build_actions
from roles.edge.agent import EdgeAgent
from roles.edge.cache.durable_cache import DurableCache
from roles.edge.node_api.certificate_keeper import CertificateKeeper
from roles.edge.node_api.tunnel_client import TunnelClient
from roles.edge.processors import ProcessorEnv
from roles.edge.settings import AgentSettings, settings_of
from roles.edge.store.store import StoreError, StoreFault, open_store, quarantine_store
from schemas.v1alpha2 import ImageStatus

Log = structlog.typing.FilteringBoundLogger

STORE_FILE = "store.sqlite"


async def run(cfg: RoleConfig, *, log: Log, config_path: Path | None = None) -> None:
    """Run the edge agent until cancelled."""
    assert isinstance(cfg, EdgeConfig)
    settings = settings_of(cfg, config_file=config_path)
    await anyio.to_thread.run_sync(private_data_dir, settings.data_dir, log)
    clock = Clock.start()
    path = settings.data_dir / STORE_FILE
    try:
        await _run(settings, cfg, path, clock, log)
    except* StoreError as group:
        error = group.exceptions[0]
        if not isinstance(error, StoreError) or error.fault is not StoreFault.CORRUPT:
            raise
        # A corrupt store would fail every start: keep it for inspection and begin afresh.
        moved = await quarantine_store(path, log=log)
        log.error("store_quarantined", path=str(path), moved_to=str(moved))
        await _run(settings, cfg, path, clock, log)


def private_data_dir(path: Path, log: Log) -> None:
    """Create the data directory, or make it the agent's alone (0700) if others may look into it.

    It holds the store (job specs, and the node's Secrets with ``localApi.serveSecrets``) and the
    control socket; join makes it 0700, and so does every start, whoever made it or changed it since
    (a filesystem mounted there, a tmpfs above all, starts out 1777).

    Errors: :class:`ConfigError` naming ``dataDir`` when it cannot be created or made private.
    """
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o7077:
            path.chmod(0o700)
            log.warning("data_dir_made_private", path=str(path), mode=f"{mode:o}")
    except OSError as exc:
        raise ConfigError(f"cannot make dataDir {path} the agent's alone (0700): {exc.strerror or exc}") from None


def _puller(cfg: EdgeConfig, log: Log) -> PullImages:
    """Image pulls through the runtime at ``cfg.cri_endpoint``, each in a child process (see
    :mod:`roles.edge.runtime.puller`: the CRI client would otherwise stay in the agent's memory)."""

    async def pull(images: tuple[str, ...], retry_times: int, auth_for: AuthFor) -> tuple[ImageStatus, ...]:
        # Loaded by the first pull, like the CRI client it starts: an agent that never pulls carries neither.
        from roles.edge.runtime.puller import pull_in_child, request_for  # noqa: PLC0415 (deferred on purpose)

        request = request_for(
            cfg.cri_endpoint,
            images,
            retry_times,
            auth_for,
            log_level=cfg.log_level,
            log_format=cfg.log_format,
            log_context=structlog.get_context(log),
        )
        return await pull_in_child(request, log=log)

    return pull


async def _serve_local_api(
    cfg: EdgeConfig,
    cache: DurableCache,
    log: Log,
    *,
    task_status: anyio.abc.TaskStatus[Callable[[], object]],
) -> None:
    """Serve the local API over ``cache`` until cancelled; reports, once listening, how to end its watches.

    Errors: OSError when its port cannot be bound (the agent stops: ``localApi.port`` is wrong).
    """
    # Loaded only when on: an agent with the local API off carries none of it.
    from roles.edge.local_api.local_api import serve_local_api  # noqa: PLC0415 (deferred on purpose)

    async with anyio.create_task_group() as tg:
        serve = functools.partial(
            serve_local_api,
            cache,
            port=cfg.local_api.port,
            serve_secrets=cfg.local_api.serve_secrets,
            max_connections=cfg.local_api.max_connections,
            max_connections_per_client=cfg.local_api.max_connections_per_client,
            log=log,
        )
        serving = await tg.start(serve)
        task_status.started(serving.api.end_watches)


async def _serve_metrics(
    agent: EdgeAgent, cfg: EdgeConfig, log: Log, *, task_status: anyio.abc.TaskStatus[int]
) -> None:
    """Serve the agent's health and metrics until cancelled (:mod:`roles.edge.metrics`).

    Errors: OSError when its port cannot be bound (``metrics.port`` is taken)."""
    # Loaded only when on: an agent with its metrics off carries no Prometheus client.
    from roles.edge.metrics import serve_metrics  # noqa: PLC0415 (deferred on purpose)

    await serve_metrics(agent.observe, port=cfg.metrics.port, log=log, task_status=task_status)


def node_credentials_dir(settings: AgentSettings, cfg: EdgeConfig) -> Path:
    """Where the node's certificate, key and CA are (``nodeApi.credentialsDir``, by default in the data directory)."""
    configured = cfg.node_api.credentials_dir
    return Path(configured) if configured else settings.data_dir / "node-credentials"


async def _serve_node_api(
    settings: AgentSettings,
    cfg: EdgeConfig,
    cache: DurableCache,
    log: Log,
    *,
    task_status: anyio.abc.TaskStatus[TunnelClient],
) -> None:
    """Serve the node's API endpoint until cancelled; reports, once listening, the tunnels it opens.

    Errors: OSError when its port cannot be bound (``nodeApi.port`` is taken).
    """
    # Loaded only when on, like the local API.
    from roles.edge.node_api.credentials import CredentialFiles  # noqa: PLC0415 (deferred on purpose)
    from roles.edge.node_api.endpoint import serve_node_api  # noqa: PLC0415 (deferred on purpose)

    node_api = cfg.node_api
    log = log.bind(component="node_api")
    tls = CredentialFiles(node_credentials_dir(settings, cfg), node_api.server_name, log=log)
    tunnels = TunnelClient(log=log)
    async with anyio.create_task_group() as tg:
        serve = functools.partial(serve_node_api, cache, tunnels, tls, node=settings.node, port=node_api.port, log=log)
        await tg.start(serve)
        task_status.started(tunnels)


async def _run(settings: AgentSettings, cfg: EdgeConfig, path: Path, clock: Clock, log: Log) -> None:
    async with contextlib.AsyncExitStack() as stack:
        store = await stack.enter_async_context(open_store(path, now=clock.now, log=log))
        cache = await DurableCache.open(store, settings.data_dir, keep_secrets=settings.cache_secrets, log=log)
        pull: PullImages | None = None
        if cfg.cri_endpoint:
            pull = _puller(cfg, log)
        else:
            log.warning("no_container_runtime", hint="criEndpoint is empty: image pulls will fail")
        agent: EdgeAgent

        def credentials(job_uid: str) -> tuple[Mapping[str, RegistryAuth], str]:
            return agent.credentials(job_uid)

        async def agent_status() -> Mapping[str, str]:
            return await agent.status()

        diagnosis = ProcessorEnv(
            node=settings.node,
            config=cfg.diagnosis,
            cri_endpoint=cfg.cri_endpoint,
            agent_status=agent_status,
            data_dir=settings.data_dir,
            own_ports=cfg.served_ports,
            log=log,
            log_level=cfg.log_level,
            log_format=cfg.log_format,
        )
        async with anyio.create_task_group() as tg:
            relisted: Callable[[], object] | None = None
            if cfg.local_api.enabled:
                relisted = await tg.start(_serve_local_api, cfg, cache, log)
            tunnels = await tg.start(_serve_node_api, settings, cfg, cache, log) if cfg.node_api.enabled else None
            certificates = None
            if cfg.node_api.enabled:
                directory = node_credentials_dir(settings, cfg)
                certificates = CertificateKeeper(directory, settings.node, log=log.bind(component="node_api"))
            agent = EdgeAgent(
                settings=settings,
                store=store,
                actions=build_actions(pull=pull, credentials=credentials, diagnosis=diagnosis),
                job_types=edge_job_types(),
                clock=clock,
                log=log,
                cache=cache,
                relisted=relisted,
                tunnels=tunnels,
                certificates=certificates,
            )
            if cfg.metrics.enabled:
                await tg.start(_serve_metrics, agent, cfg, log)
            await agent.run()
            tg.cancel_scope.cancel()
