"""Shared pytest set-up: the local control plane plugin (used by the integration tests only)."""

pytest_plugins = ["tests.integration.controlplane"]
