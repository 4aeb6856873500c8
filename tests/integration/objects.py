"""Helpers that create test objects with kubectl, as a user would."""

from __future__ import annotations

import random

import msgspec

from tests.integration.controlplane import ControlPlane


def unique(prefix: str) -> str:
    """A fresh object name: tests share one control plane per session."""
    return f"{prefix}-{random.randrange(16**8):08x}"


def create_job(cp: ControlPlane, kind: str, name: str, spec: dict[str, object]) -> None:
    """Create a v1alpha2 node job."""
    doc = {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": kind, "metadata": {"name": name}, "spec": spec}
    cp.kubectl("create", "-f", "-", input=msgspec.json.encode(doc).decode())
