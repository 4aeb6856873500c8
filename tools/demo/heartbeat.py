"""The heartbeat of the demo's agent-only edges: their Nodes have no kubelet, so the demo renews each one's
Lease in ``kube-node-lease`` as a kubelet would. Without it the node lifecycle controller would mark them
NotReady a grace period after their registration (and the controller gives no job to a NotReady Node), which
would hold every Node's grace, the devices' included, to the length of the jobs scene."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final, Protocol

from tools.demo.kube import ApiFailure

LEASE_NAMESPACE: Final = "kube-node-lease"
LEASES: Final = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NAMESPACE}/leases"
DURATION_S: Final = 12
"""The Leases' duration, the devices' kubelets' too (``devices.KUBELET_SETTINGS``)."""
RENEW_S: Final = DURATION_S / 4
"""As a kubelet renews: a quarter of the duration, 3 s, well within the demo's 20 s grace (``devices.NODE_MONITOR``)."""


class Requests(Protocol):
    """What the heartbeat needs of :class:`tools.demo.kube.Api`."""

    def request(self, method: str, path: str, body: object = None, *, patch: bool = False) -> Any: ...


def lease(node: str, renew_time: str) -> dict[str, object]:
    """Node ``node``'s Lease, renewed at ``renew_time``."""
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": DURATION_S, "renewTime": renew_time},
    }


def micro_time(moment: datetime) -> str:
    """A Lease's renewTime (Kubernetes' MicroTime: RFC 3339 with microseconds, UTC)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Heartbeat:
    """Renews the Leases of ``nodes`` every :data:`RENEW_S` seconds from a thread, until :meth:`stop`.

    A renewal that fails (the API server restarting, say) is tried again at the next beat; the first
    failure is kept in :attr:`problem` for the summary's reader, since a Node left unrenewed goes NotReady.
    """

    def __init__(self, api: Requests, nodes: Sequence[str]) -> None:
        self._api = api
        self._nodes = list(nodes)
        self._created: set[str] = set()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-heartbeat", daemon=True)
        self.problem = ""

    def start(self) -> None:
        """Renew once for every node (so that a failure to start is raised here), then keep renewing."""
        self.beat()
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def beat(self) -> None:
        """Renew every node's Lease now (create it the first time)."""
        renew_time = micro_time(datetime.now(UTC))
        for node in self._nodes:
            if node in self._created:
                self._api.request("PATCH", f"{LEASES}/{node}", {"spec": {"renewTime": renew_time}}, patch=True)
            else:
                self._api.request("POST", LEASES, lease(node, renew_time))
                self._created.add(node)

    def renew(self) -> None:
        """:meth:`beat`, keeping the first failure in :attr:`problem` instead of raising it."""
        try:
            self.beat()
        except ApiFailure as exc:
            self.problem = self.problem or str(exc)

    def _run(self) -> None:
        while not self._stopped.wait(RENEW_S):
            self.renew()
