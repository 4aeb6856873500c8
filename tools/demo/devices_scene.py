"""The demo's last scene, on the real nodes: every hub stopped, the devices' pods keep answering; the cloud
marks both Nodes NotReady, keeps the pod of the one asking for autonomy and evicts the other's; one device
is restarted whole while the cloud is still gone and runs its pod again from its agent's cache; then the
hubs come back on their ports, the Nodes are Ready, and a ConfigMap changed meanwhile reaches the pod."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Final

from tools.demo import devices as dev
from tools.demo.bringup import answers_ok, hub_bound, start_hub
from tools.demo.fleet import edge_launcher
from tools.demo.kube import hubs_of_nodes
from tools.demo.state import Demo, DemoError
from tools.ports import held

BRING_UP_LIMIT: Final = 240.0
"""Longest the scene waits for the real nodes' bring-up (started beside the jobs) to end."""
LIMIT: Final = 120.0


def go_offline(demo: Demo) -> None:
    """The scene; says why it does not run when the real nodes did not come up."""
    devices = demo.devices
    if devices is None:
        return
    with demo.console.status("waiting for the real nodes' bring-up"):
        over = devices.join(BRING_UP_LIMIT)
    view = devices.view
    if not over:
        view.problem = f"their bring-up did not end within {BRING_UP_LIMIT:g} s"
    if view.problem:
        demo.say(f"real nodes: skipping their scene: {view.problem}", "bold yellow")
        return
    assert demo.cp is not None
    cp = demo.cp
    autonomous, other = dev.NAMES
    ips = {name: _pod_ip(dev.pod(cp, name)) for name in dev.NAMES}
    hubs = list(demo.hubs)
    demo.procs.stop([hub.name for hub in hubs])
    with contextlib.ExitStack() as holding:
        for hub in hubs:  # as the autonomy scene does: nothing else may take their ports meanwhile
            for port in (hub.port, hub.http_port):
                try:
                    holding.enter_context(held(port))
                except OSError as exc:
                    raise DemoError(f"{hub.name}'s port {port} was taken as soon as the hub stopped: {exc}") from exc
        patch = json.dumps({"data": {"index.html": dev.NEW_PAGE}})
        cp.kubectl("patch", "configmap", dev.page_name(autonomous), "-n", dev.NAMESPACE, "--type=merge", "-p", patch)
        view.offline = {name: dev.answer(ip) or "(no answer)" for name, ip in ips.items()}
        demo.say(
            "every hub stopped (the cloud is gone for the devices); ConfigMap "
            f"{dev.page_name(autonomous)} changed meanwhile; the pods still answer: "
            + "; ".join(f"{d}: {t.strip()!r}" for d, t in view.offline.items())
        )
        restart_device(demo, autonomous)

        def not_ready() -> bool:
            view.not_ready = {name: dev.ready_status(cp, name) for name in dev.NAMES}
            return all(status in ("Unknown", "False") for status in view.not_ready.values())

        demo.wait("the cloud to mark both devices' Nodes NotReady", not_ready, limit=LIMIT)
        demo.say("in the cloud: " + ", ".join(f"{d} Ready {s}" for d, s in view.not_ready.items()))
        demo.wait(
            f"{other}'s pod to be evicted ({dev.SHORT_TOLERATION_S} s toleration)",
            lambda: _evicted(cp, other),
            limit=LIMIT,
        )
        kept = dev.pod(cp, autonomous)
        if kept is not None and not kept["metadata"].get("deletionTimestamp"):
            view.kept = autonomous
        view.evicted = other
        demo.say(f"{other}'s pod evicted in the cloud; {autonomous}'s kept: {view.kept == autonomous}")
        for hub in hubs:
            back = hub_bound(demo, start_hub(demo, hub.name, port=hub.port, http_port=hub.http_port))
            if (back.port, back.http_port) != (hub.port, hub.http_port):
                raise DemoError(f"{hub.name} came back on ports {back.port}, {back.http_port}, not its own")
        demo.record()
    for hub in hubs:
        demo.wait(f"{hub.name} to be ready again", answers_ok(hub.ready_url, demo.hub_client()), limit=60)

    def all_ready() -> bool:
        view.ready_again = [name for name in dev.NAMES if dev.ready(cp, name)]
        return len(view.ready_again) == len(dev.NAMES)

    demo.wait("the devices' Nodes Ready again", all_ready, limit=LIMIT, fatal=False)
    api = demo.api
    assert api is not None
    names = [e.name for e in demo.edges] + list(dev.NAMES)
    # Every agent lost its hub too; after a minute of refused attempts each waits up to its reconnectMaxDelay.
    demo.wait(
        "every edge to hold a hub session again",
        lambda: all(hubs_of_nodes(api).get(n) for n in names),
        limit=LIMIT,
        fatal=False,
    )

    def new_page() -> bool:
        candidates = {_pod_ip(dev.pod(cp, autonomous)), devices.restarted_ip}
        view.new_page = next((t for ip in candidates if ip and (t := dev.answer(ip)) == dev.NEW_PAGE), "")
        return bool(view.new_page)

    demo.wait(f"{autonomous}'s pod to answer its changed ConfigMap", new_page, limit=LIMIT, fatal=False)
    demo.say(f"hubs back: {', '.join(view.ready_again)} Ready; {autonomous}'s pod answers {view.new_page!r}")


def restart_device(demo: Demo, name: str) -> None:
    """A whole device restart: containers, containerd, the kubelet and the agent killed, then started again;
    waits for its pod to answer from a new container, with the cloud still gone."""
    devices = demo.devices
    assert devices is not None
    node = devices.nodes[name]
    before = node.tasks()
    node.power_off()
    demo.procs.stop([name], grace=0)
    demo.procs.start(name, edge_launcher(demo.layout.edge(name) / "edge.yaml"), log=demo.layout.log(name))
    demo.record()
    node.power_on()
    found: list[tuple[str, str]] = []

    def back() -> bool:
        found[:] = [pair] if (pair := dev.restarted_pod(node, before)) else []
        return bool(found)

    demo.wait(f"{name}'s pod to run again from its cache after a whole restart", back, limit=LIMIT)
    devices.restarted_ip, devices.view.restarted = found[0]
    demo.say(f"{name} restarted whole (cloud still gone): its new container at {found[0][0]} answers {found[0][1]!r}")


def _pod_ip(pod: dict[str, Any] | None) -> str:
    return str(((pod or {}).get("status") or {}).get("podIP") or "")


def _evicted(cp: Any, device: str) -> bool:
    pod = dev.pod(cp, device)
    return pod is None or bool(pod["metadata"].get("deletionTimestamp"))
