"""In-process edge agents for integration tests (the real agent code with a fake container runtime)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Final

import anyio
import msgspec
import structlog

from nodetask.clock import Clock
from nodetask.phases import ConditionStatus
from roles.common.jobtypes import job_types
from roles.common.registry_auth import RegistryAuth
from roles.edge.actions import AuthFor, build_actions
from roles.edge.agent import EdgeAgent
from roles.edge.checks.checks import Thresholds
from roles.edge.settings import AgentSettings
from roles.edge.store.store import open_store
from schemas.v1alpha2 import ImageStatus
from tools.processes import role_command

RECONNECT_MAX_DELAY_S: Final = 3
"""The longest wait of the tests' agents between two attempts to reach a hub (``reconnectMaxDelay``)."""
HANDSHAKE_TIMEOUT_S: Final = 10
"""The longest one attempt of theirs may take (``handshakeTimeout``): the fault tests kill hubs while agents
connect, and an attempt the dead hub's kernel had accepted waits this long before the next hub is tried."""


class FakeRuntime:
    """Stands in for the CRI runtime (tested on its own against containerd): pulls take ``delay``."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.pulls = 0
        self.finished = 0

    async def pull(self, images: tuple[str, ...], retry_times: int, auth_for: AuthFor) -> tuple[ImageStatus, ...]:
        self.pulls += 1
        await anyio.sleep(self.delay)
        self.finished += 1
        return tuple(ImageStatus(image=i, status=ConditionStatus.TRUE) for i in images)


@asynccontextmanager
async def running_agent(
    node: str, token: str, url: str, data_dir: Path, runtime: FakeRuntime, *, store_max_bytes: int | None = None
) -> AsyncIterator[EdgeAgent]:
    """An in-process edge agent with its store in ``data_dir``."""
    settings = AgentSettings(
        node=node,
        version="v0.1.0",
        hub_urls=(url,),
        token=token,
        data_dir=data_dir,
        # The checks run for real, but a busy CI machine must not fail them: nothing exceeds 100%.
        thresholds=Thresholds(cpu=100.0, mem=100.0, disk=100.0),
        reconnect_cap=RECONNECT_MAX_DELAY_S,
        handshake_timeout=HANDSHAKE_TIMEOUT_S,
    )
    async with open_store(data_dir / "store.sqlite", max_bytes=store_max_bytes) as store:
        agent: EdgeAgent

        def credentials(job_uid: str) -> tuple[Mapping[str, RegistryAuth], str]:
            return agent.credentials(job_uid)  # what the hub sent, as the edge role wires it

        agent = EdgeAgent(
            settings=settings,
            store=store,
            actions=build_actions(pull=runtime.pull, credentials=credentials),
            job_types=job_types(),
            clock=Clock.start(),
            log=structlog.get_logger(),
        )
        async with anyio.create_task_group() as tg:
            await tg.start(agent.run)
            yield agent
            tg.cancel_scope.cancel()


def write_agent_config(home: Path, *, node: str, token: str, hub_urls: list[str], **options: object) -> Path:
    """Write an agent's token file and config (its store under ``home/data``); returns the config's path.

    The checks' thresholds default to 100% so a busy test machine never fails them, and an agent waits at most
    :data:`RECONNECT_MAX_DELAY_S` between attempts to reach a hub (the tests stop hubs for tens of seconds, and
    production's 30 s would be most of a test's wait once they are back) and gives up an attempt after
    :data:`HANDSHAKE_TIMEOUT_S`; ``options`` (camelCase keys) override anything.
    """
    home.mkdir(parents=True, exist_ok=True)
    (home / "token").write_text(token)
    config = {
        "nodeName": node,
        "hubUrls": hub_urls,
        "tokenFile": str(home / "token"),
        "dataDir": str(home / "data"),
        "criEndpoint": "",
        "maxCpuUsage": 100,
        "reconnectMaxDelay": RECONNECT_MAX_DELAY_S,
        "handshakeTimeout": HANDSHAKE_TIMEOUT_S,
        **options,
    }
    path = home / "edge.yaml"
    path.write_bytes(msgspec.yaml.encode(config))
    return path


def agent_command(config: Path) -> list[str]:
    """The command line of a real agent process with ``config``."""
    return role_command("edge", config)
