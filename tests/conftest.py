"""Shared pytest set-up: the local control plane and the containerd + registry plugins (integration tests),
and hypothesis without its per-example deadline."""

import pytest
import structlog
from hypothesis import settings

pytest_plugins = ["tests.integration.controlplane", "tools.provision.containerd", "pytester"]

# A deadline is a timed assertion: on a loaded 2-core machine a slow example is not a failing one.
settings.register_profile("nodetaskd", deadline=None)
settings.load_profile("nodetaskd")

# Roles run inside test processes log through structlog's default console renderer, whose rich tracebacks
# (with every frame's locals) took seconds to render an action's exception on a loaded machine, on the
# event loop the in-process hub and agent share: the agent missed its heartbeats. Plain tracebacks, as the
# daemon's own logging renders them (roles/common/logs.py).
structlog.configure(
    processors=[
        *structlog.get_config()["processors"][:-1],
        structlog.dev.ConsoleRenderer(exception_formatter=structlog.dev.plain_traceback),
    ]
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules of slow tests first, longest first (``slow(seconds)``: about how long the module takes
    alone), the rest in file order. Handed out a module at a time in this order (``--dist loadscope
    --no-loadscope-reorder``), the longest start at once on different test processes instead of one of
    them starting last and ending the run alone; a module stays on one process, so its module fixtures
    (a second control plane, a built image) are made once."""

    def alone_s(item: pytest.Item) -> float:
        slow = item.get_closest_marker("slow")
        return float(slow.args[0]) if slow is not None and slow.args else 0.0

    items.sort(key=alone_s, reverse=True)
