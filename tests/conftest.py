"""Shared pytest set-up: the local control plane and the containerd + registry plugins (integration tests),
and hypothesis without its per-example deadline."""

from hypothesis import settings

pytest_plugins = ["tests.integration.controlplane", "tools.provision.containerd", "pytester"]

# A deadline is a timed assertion: on a loaded 2-core machine a slow example is not a failing one.
settings.register_profile("nodetaskd", deadline=None)
settings.load_profile("nodetaskd")
