"""The demo's third scene: one edge asks for autonomy, its hub is stopped and the device's local API still
answers kubectl; then the hub comes back on its ports and the edge reconnects and relists a change made
meanwhile (what it reads and shows are in :mod:`tools.demo.autonomy`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
from typing import Final

from rich.markup import escape

from nodetask.autonomy import AUTONOMY_ANNOTATION, STATUS_LABEL
from tools.demo import autonomy
from tools.demo.bringup import answers_ok, hub_bound, start_hub
from tools.demo.fleet import Edge, Hub
from tools.demo.kube import hubs_of_nodes
from tools.demo.state import Demo, DemoError
from tools.ports import held

RETURN_LIMIT: Final = 90.0
"""Longest the cut-off edge may take to reconnect to its returned hub and relist: its reconnect backoff
reaches 30 s only after about a minute of refused attempts."""


def cut_off_edge(demo: Demo) -> None:
    """The autonomy step: ask autonomy for one edge's Node, give it an app, cut its hub off, read its local API."""
    assert demo.api is not None
    assert demo.cp is not None
    api, cp = demo.api, demo.cp
    edge = next(e for e in demo.edges if e.local_api_port)
    hub, port = edge.hubs[0], edge.local_api_port
    autonomy.request_autonomy(api, edge.name)
    # Pod admission wants the namespace's default ServiceAccount; the controller manager may not have made it yet.
    cp.kubectl("create", "serviceaccount", "default", "-n", autonomy.NAMESPACE, check=False)
    cp.kubectl("apply", "-f", "-", input=json.dumps(autonomy.app_manifest(edge.name)))
    demo.say(
        f"autonomy: {edge.name} asks for it ({AUTONOMY_ANNOTATION}=true) and gets a Pod "
        f"{autonomy.NAMESPACE}/{autonomy.POD} and its ConfigMap {autonomy.CONFIG_MAP}; its local API is on "
        f"127.0.0.1:{port}"
    )
    demo.wait(f"{edge.name}'s local API to serve its Pod and ConfigMap", lambda: autonomy.app_cached(port), limit=60)
    demo.wait(
        f"{edge.name}'s Autonomy condition True and the controller's {STATUS_LABEL}=true",
        lambda: autonomy.approved(api, edge.name),
        limit=60,
    )
    demo.procs.stop([hub.name])
    with contextlib.ExitStack() as holding:
        # Its ports stay bound, refusing connections as the stopped hub does, until it is back on them:
        # nothing else (an outgoing connection's local port included) can take them meanwhile.
        for kept in (hub.port, hub.http_port):
            try:
                holding.enter_context(held(kept))
            except OSError as exc:
                raise DemoError(f"{hub.name}'s port {kept} was taken as soon as the hub stopped: {exc}") from exc
        demo.say(f"{hub.name} stopped: {edge.name} lists no other hub, so it is cut off from the cloud")
        args = ("get", "pods", "-A", "--field-selector", f"spec.nodeName={edge.name}")
        command = f"kubectl --server=http://127.0.0.1:{port} {' '.join(args)}"
        home = demo.layout.edge(edge.name) / "kubectl"
        result = autonomy.local_kubectl(cp.binaries.kubectl, port, home, *args)
        answer = autonomy.pod_line(result.stdout) if result.returncode == 0 else ""
        error = "" if answer else " ".join((result.stderr or result.stdout or f"exit {result.returncode}").split())
        demo.cut_off = autonomy.AutonomyView(
            node=edge.name, hub=hub.name, port=port, command=command, answer=answer, error=error[:300]
        )
        if answer:
            demo.say(f"$ {command}\n    {answer}")
        else:
            demo.say(f"{command} failed: {error[:300]}", "bold yellow")
        returned = bring_back(demo, edge, hub, holding)
    demo.cut_off = dataclasses.replace(demo.cut_off, returned=returned)


def bring_back(demo: Demo, edge: Edge, hub: Hub, holding: contextlib.ExitStack) -> autonomy.HubReturn:
    """Change the app's ConfigMap in the cloud, start ``hub`` again on its ports (held by ``holding`` till then)
    and follow the cut-off ``edge`` back: reconnected, relisted, serving the change."""
    assert demo.cp is not None
    assert demo.api is not None
    api, port = demo.api, edge.local_api_port
    patch = ("patch", "configmap", autonomy.CONFIG_MAP, "-n", autonomy.NAMESPACE, "--type=merge")
    demo.cp.kubectl(*patch, "-p", autonomy.greeting_change())
    demo.say(
        f"meanwhile, in the cloud: ConfigMap {autonomy.CONFIG_MAP} gets greeting {autonomy.CHANGED_GREETING!r}; "
        f"{edge.name}'s local API still serves {autonomy.local_greeting(port)!r}"
    )
    log = demo.layout.log(edge.name)
    offset = log.stat().st_size
    back = hub_bound(demo, start_hub(demo, hub.name, port=hub.port, http_port=hub.http_port))
    demo.record()
    if (back.port, back.http_port) != (hub.port, hub.http_port):
        raise DemoError(f"{hub.name} came back on ports {back.port}, {back.http_port}, not its own")
    holding.close()  # it listens on them now
    demo.wait(f"{hub.name} to be ready again", answers_ok(hub.ready_url, demo.hub_client()), limit=60)
    demo.say(f"{hub.name} started again on its ports ({hub.url}), which the demo kept bound while it was down")
    reconnected = relisted = ""

    def back_and_relisted() -> bool:
        nonlocal reconnected, relisted
        reconnected = reconnected or autonomy.log_line(log, offset, autonomy.RECONNECTED, f"hub={hub.name}")
        relisted = relisted or autonomy.log_line(log, offset, autonomy.RELISTED)
        # The cloud's side of the reconnect: the hub marks the Node as held by it again.
        return bool(reconnected and relisted) and hubs_of_nodes(api).get(edge.name) == hub.name

    demo.wait(
        f"{edge.name} to reconnect to {hub.name} and relist its cache",
        back_and_relisted,
        limit=RETURN_LIMIT,
        fatal=False,
    )
    greeting = ""

    def changed() -> bool:
        nonlocal greeting
        greeting = autonomy.local_greeting(port)
        return greeting == autonomy.CHANGED_GREETING

    demo.wait(f"{edge.name}'s local API to serve the change", changed, limit=30, fatal=False)
    returned = autonomy.HubReturn(
        hub=hub.name, url=hub.url, reconnected=reconnected, relisted=relisted, greeting=greeting
    )
    for line in autonomy.return_lines(edge.name, returned):
        demo.say(escape(line), "" if returned.complete else "bold yellow")  # log lines hold [brackets]
    return returned
