"""Shared pytest set-up: the local control plane and the containerd + registry plugins (integration tests)."""

pytest_plugins = ["tests.integration.controlplane", "tools.provision.containerd"]
