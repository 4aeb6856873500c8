"""The API client looks its proxy up once, as kubectl reads it: kubeconfig first, then the environment."""

from __future__ import annotations

import pytest

from roles.kube.aio import _proxy_for


def test_the_kubeconfig_proxy_wins_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``proxy-url`` in the kubeconfig is used as it is, whatever HTTPS_PROXY says."""
    monkeypatch.setenv("HTTPS_PROXY", "http://env-proxy:3128")
    assert _proxy_for("https://10.0.0.1:6443", "http://kube-proxy:8080") == ("http://kube-proxy:8080", None)


def test_the_environment_proxy_is_used_unless_no_proxy_exempts_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTPS_PROXY (with its credentials) for an https API server; none for a host NO_PROXY lists, or without one."""
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@env-proxy:3128")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    proxy, auth = _proxy_for("https://api.example:6443", None)
    assert proxy == "http://env-proxy:3128"
    assert auth is not None
    assert (auth.login, auth.password) == ("user", "secret")
    monkeypatch.setenv("NO_PROXY", "api.example")
    assert _proxy_for("https://api.example:6443", None) == (None, None)
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.delenv("https_proxy", raising=False)
    assert _proxy_for("https://api.example:6443", None) == (None, None)
