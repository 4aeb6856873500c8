"""``nodetaskd edge join`` writes what the agent needs under a root, checks everything first, and reset undoes it."""

from __future__ import annotations

import socket
import stat
from pathlib import Path

import pytest

from roles.config import EdgeConfig, load_config
from roles.join import JoinError, Layout, join, render_unit, reset
from roles.tls import generate_serving_certificate

TEMPLATE = (Path(__file__).resolve().parents[2] / "containers" / "systemd" / "nodetaskd-edge.service").read_text()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "edge-1.token"
    path.write_text("s3cret-token\n")
    return path


def _join(root: Path, token: Path, **options: object) -> list[str]:
    arguments: dict[str, object] = {"node": "edge-1", "hubs": ("wss://hub.example:10004",), "token_file": token}
    return join(root=root, python="/opt/nodetaskd/venv/bin/python", **{**arguments, **options})  # type: ignore[arg-type]


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_the_unit_runs_the_launcher_of_this_installation_on_the_written_config() -> None:
    """ExecStart and WorkingDirectory name this interpreter, the config and the data directory; the rest is kept."""
    unit = render_unit(
        TEMPLATE,
        python="/usr/bin/python3",
        config=Path("/etc/nodetaskd/edge.yaml"),
        data_dir=Path("/var/lib/nodetaskd"),
    )
    assert "ExecStart=/usr/bin/python3 -m roles.edge.launcher --config /etc/nodetaskd/edge.yaml\n" in unit
    assert "WorkingDirectory=/var/lib/nodetaskd\n" in unit
    assert "StateDirectory=nodetaskd\n" in unit
    assert "KillMode=mixed\n" in unit
    assert "Restart=on-failure\n" in unit
    elsewhere = render_unit(TEMPLATE, python="/p", config=Path("/r/edge.yaml"), data_dir=Path("/r/var/lib/nodetaskd"))
    assert "StateDirectory" not in elsewhere  # systemd would create /var/lib/nodetaskd, which is not the one used
    assert "WorkingDirectory=/r/var/lib/nodetaskd\n" in elsewhere


def test_join_writes_the_token_config_data_directory_and_unit_under_the_root(tmp_path: Path, token: Path) -> None:
    """Every file is where the unit and config say, private where it holds a secret, and the config loads."""
    root = tmp_path / "root"
    ca = generate_serving_certificate(tmp_path / "ca", dns_names=["hub.example"]).cert_file.parent / "ca.crt"
    done = _join(root, token, ca_file=ca)
    layout = Layout(root)
    assert layout.token.read_text() == "s3cret-token\n"
    assert stat.S_IMODE(layout.token.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.config.stat().st_mode) == 0o600
    assert stat.S_IMODE(layout.data_dir.stat().st_mode) == 0o700
    assert layout.ca.read_bytes() == ca.read_bytes()
    cfg = load_config("edge", layout.config, {})
    assert isinstance(cfg, EdgeConfig)
    assert (cfg.node_name, cfg.hub_urls) == ("edge-1", ("wss://hub.example:10004",))
    assert (cfg.token_file, cfg.ca_file, cfg.data_dir) == (str(layout.token), str(layout.ca), str(layout.data_dir))
    unit = layout.unit.read_text()
    assert f"--config {layout.config}\n" in unit
    assert any("systemctl daemon-reload && systemctl enable --now nodetaskd-edge" in line for line in done)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"hubs": ("ws://hub.example:10004",)}, "plain ws://.*--allow-plain-ws"),
        ({"hubs": ()}, "--hub is required"),
        ({"node": "Edge_1"}, "not a Kubernetes node name"),
        ({"ca_file": Path("/nonexistent/ca.crt")}, "cannot read the CA file /nonexistent/ca.crt"),
    ],
)
def test_bad_input_is_refused_naming_it_and_nothing_is_written(
    tmp_path: Path, token: Path, options: dict[str, object], message: str
) -> None:
    """A plain hub URL, no hub, a bad node name or an unreadable CA stop the join before any file exists."""
    root = tmp_path / "root"
    with pytest.raises(JoinError, match=message):
        _join(root, token, **options)
    assert not root.exists()


def test_an_empty_token_or_a_ca_that_is_no_certificate_is_refused(tmp_path: Path, token: Path) -> None:
    """The token must have content and the CA must load as PEM: each refusal names the file."""
    empty = tmp_path / "empty.token"
    empty.write_text("\n")
    with pytest.raises(JoinError, match=f"the token file {empty} is empty"):
        _join(tmp_path / "root", empty)
    garbage = tmp_path / "garbage.crt"
    garbage.write_text("not a certificate\n")
    with pytest.raises(JoinError, match=f"the CA file {garbage} holds no usable PEM certificate"):
        _join(tmp_path / "root", token, ca_file=garbage)


def test_plain_ws_is_accepted_when_allowed(tmp_path: Path, token: Path) -> None:
    """--allow-plain-ws opens the door the refusal names."""
    _join(tmp_path / "root", token, hubs=("ws://127.0.0.1:10004",), allow_plain_ws=True)
    assert load_config("edge", Layout(tmp_path / "root").config, {}).hub_urls == ("ws://127.0.0.1:10004",)  # type: ignore[union-attr]


def test_a_second_join_is_refused_unless_forced_and_force_keeps_the_data(tmp_path: Path, token: Path) -> None:
    """An existing join is never overwritten silently; --force rewrites the config and keeps the agent's store."""
    root = tmp_path / "root"
    _join(root, token)
    store = Layout(root).data_dir / "store.sqlite"
    store.write_bytes(b"state")
    with pytest.raises(JoinError, match=r"already has an edge configuration.*--force"):
        _join(root, token, node="edge-2")
    _join(root, token, node="edge-2", force=True)
    assert load_config("edge", Layout(root).config, {}).node_name == "edge-2"  # type: ignore[union-attr]
    assert store.read_bytes() == b"state"


def test_reset_removes_what_join_created_and_nothing_else(tmp_path: Path, token: Path) -> None:
    """After reset only what was there before the join is left; a second reset has nothing to do."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "hostname").write_text("device\n")
    _join(root, token)
    (Layout(root).config.parent / "edge.yaml.pending-update").write_text("left by a config update\n")
    done = reset(root=root)
    assert _tree(root) == ["etc", "etc/hostname"]
    assert done[-1].startswith("edge-1 is no longer joined here")
    assert reset(root=root) == [f"nothing to reset: no join under {root} ({Layout(root).record} does not exist)"]


def test_reset_refuses_while_the_agent_answers_on_its_control_socket(tmp_path: Path, token: Path) -> None:
    """A running agent is not pulled from under itself: reset says to stop it first and removes nothing."""
    root = Path("/tmp") / f"ntd-join-{tmp_path.name[-12:]}"  # a unix socket path must stay short
    try:
        _join(root, token)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as agent:
            agent.bind(str(Layout(root).data_dir / "control.sock"))
            agent.listen(1)
            with pytest.raises(JoinError, match=r"is running.*stop it first"):
                reset(root=root)
        assert Layout(root).config.exists()
        reset(root=root)  # the agent stopped (its socket closed): now it goes
        assert not Layout(root).config.exists()
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
