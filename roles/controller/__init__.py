"""The controller role: owns every node job's lifecycle in the API server.

Selection, initial node entries, job phase, timeouts and Events are decided here (single active
instance); the hubs only execute. ``--feature-gates=disableNodeTaskV1alpha2`` turns the v1alpha2
controllers off, as in KubeEdge.
"""

from __future__ import annotations

import structlog

from nodetask.clock import Clock
from roles.config import ControllerConfig, RoleConfig
from roles.controller.reconciler import Reconciler
from roles.kube import open_kube
from schemas.kinds import KINDS


async def run(cfg: RoleConfig, *, log: structlog.typing.FilteringBoundLogger) -> None:
    """Run the controller until cancelled."""
    assert isinstance(cfg, ControllerConfig)
    kinds = () if "disableNodeTaskV1alpha2" in cfg.feature_gates else KINDS
    if not kinds:
        log.warning("controllers_disabled", gate="disableNodeTaskV1alpha2")
    async with open_kube(kubeconfig=cfg.kubeconfig, log=log) as kube:
        reconciler = Reconciler(kube=kube, clock=Clock.start(), log=log, kinds=kinds)
        await reconciler.run()
