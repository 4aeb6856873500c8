"""``nodetaskd edge join`` writes what the agent needs under a root, checks everything first, and reset undoes it."""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from roles.cli.join import join
from roles.cli.join_layout import JoinError, Layout
from roles.cli.join_probe import HubAnswer, Outcome, probe_hubs, verdict
from roles.cli.main import main
from roles.cli.reset import reset
from roles.cli.systemd_unit import render_unit
from roles.common.config import EdgeConfig, load_config
from roles.common.tls import generate_serving_certificate
from tools.ports import free_port

TOKEN = "0P2JxTsk7bWk4iJx1qkJd5Ql2m6vyUeXv2VYg8TnQ-E"
"""Shaped as ``token create`` makes them (43 URL-safe characters)."""
TEMPLATE = (Path(__file__).resolve().parents[4] / "containers" / "systemd" / "nodetaskd-edge.service").read_text()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "edge-1.token"
    path.write_text(f"{TOKEN}\n")
    return path


def _join(root: Path, token: Path, **options: object) -> list[str]:
    arguments: dict[str, object] = {
        "node": "edge-1",
        "hubs": ("wss://hub.example:10004",),
        "token_file": token,
        "python": "/opt/nodetaskd/venv/bin/python",
    }
    return join(root=root, **{**arguments, **options})  # type: ignore[arg-type]


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
    assert layout.token.read_text() == f"{TOKEN}\n"
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


def test_a_ca_bundle_with_comments_in_any_script_is_copied_whole(tmp_path: Path, token: Path) -> None:
    """A bundle's text around its certificates (names in any script, as curl's cacert.pem has) is kept."""
    ca = generate_serving_certificate(tmp_path / "ca", dns_names=["hub.example"]).cert_file.parent / "ca.crt"
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes("## NetLock Arany (Class Gold) Főtanúsítvány\n".encode() + ca.read_bytes())
    _join(tmp_path / "root", token, ca_file=bundle)
    assert Layout(tmp_path / "root").ca.read_bytes() == bundle.read_bytes()


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


def _cli(*args: str, limit_memory: bool = False) -> subprocess.CompletedProcess[str]:
    """``nodetaskd ARGS`` in its own process (a hang or an exhausted memory then fails only it)."""

    def cap_memory() -> None:  # 1 GiB of address space: this interpreter with the base install needs ~50 MiB
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run(
        [sys.executable, "-m", "roles.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        preexec_fn=cap_memory if limit_memory else None,
    )


def _join_args(root: Path, token: Path, *extra: str) -> list[str]:
    return [
        "edge",
        "join",
        "--hub=wss://hub.example:10004",
        "--node=edge-1",
        f"--token-file={token}",
        f"--root={root}",
        *extra,
    ]


def test_a_root_with_a_newline_is_refused_before_anything_is_written(tmp_path: Path, token: Path) -> None:
    """A newline in --root would add lines to the unit (ExecStartPre=...): join refuses it and writes nothing."""
    root = tmp_path / "root\nExecStartPre=/bin/sh -c id"
    done = _cli(*_join_args(root, token))
    assert done.returncode == 2, done.stderr
    assert "holds a control character" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edge-1.token"]


def test_the_unit_quotes_paths_as_systemd_reads_them() -> None:
    """Spaces, quotes, backslashes, % and $ in the paths reach systemd as they are, never as words or specifiers."""
    config = Path('/r 100%/$HOME/"q"\\/edge.yaml')
    unit = render_unit(TEMPLATE, python="/opt/my env/bin/python", config=config, data_dir=Path("/r 100%/var/lib/x"))
    expected = (
        'ExecStart="/opt/my env/bin/python" -m roles.edge.launcher --config "/r 100%%/$$HOME/\\"q\\"\\\\/edge.yaml"\n'
    )
    assert expected in unit
    assert "WorkingDirectory=/r 100%%/var/lib/x\n" in unit
    with pytest.raises(JoinError, match="the interpreter's path 'python3' is not absolute"):
        render_unit(TEMPLATE, python="python3", config=config, data_dir=Path("/d"))
    with pytest.raises(JoinError, match="holds a quote or backslash: systemd starts no such program"):
        render_unit(TEMPLATE, python="/o'brien/python3", config=config, data_dir=Path("/d"))


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_systemd_reads_the_unit_of_a_join_under_an_awkward_root(tmp_path: Path, token: Path) -> None:
    """systemd-analyze verify takes the written unit, and finds its interpreter at a path with a space and a %."""
    root = tmp_path / 'a root "with" 50% $PATH'
    python = tmp_path / "venv 100%" / "python"
    python.parent.mkdir()
    python.symlink_to(sys.executable)
    _join(root, token, python=str(python))
    verified = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(Layout(root).unit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert verified.returncode == 0, verified.stderr
    assert verified.stderr == ""


def test_a_token_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """Reading a FIFO nobody writes to would hang the join: it is refused as not a regular file."""
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    done = _cli(*_join_args(tmp_path / "root", fifo))
    assert done.returncode == 2, done.stderr
    assert f"the token file {fifo} is a FIFO: give a regular file" in done.stderr
    assert not (tmp_path / "root").exists()


def test_a_token_file_that_is_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    """/dev/zero never ends: read whole it exhausts the process's memory; it is refused as a device."""
    done = _cli(*_join_args(tmp_path / "root", Path("/dev/zero")), limit_memory=True)
    assert done.returncode == 2, done.stderr
    assert "the token file /dev/zero is a character device: give a regular file" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b"root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\n", "holds more than one line"),
        (b"-----BEGIN PRIVATE KEY-----", "holds characters a bearer token cannot"),
        (b"short\n", "holds 5 characters, and a token has 16 to 1024"),
        (b"\xff\xfe" * 20, "holds bytes that are not ASCII"),
        (b"a" * 5000, "is 5000 bytes; it cannot be more than 4096"),
    ],
)
def test_a_file_that_is_no_token_is_not_installed_as_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, says: str
) -> None:
    """Another file's secrets, a key, binary or an oversized file are refused, naming why; nothing is written."""
    other = tmp_path / "not-a-token"
    other.write_bytes(content)
    assert main(_join_args(tmp_path / "root", other)) == 2
    err = capsys.readouterr().err
    assert f"the token file {other}" in err
    assert says in err
    assert "root:x" not in err  # the content is never shown
    assert not (tmp_path / "root").exists()


def test_a_ca_file_that_is_a_fifo_is_refused_at_once(tmp_path: Path, token: Path) -> None:
    """The CA file is read the same way as the token: a FIFO is refused instead of hanging the join."""
    fifo = tmp_path / "ca.crt"
    os.mkfifo(fifo)
    done = _cli(*_join_args(tmp_path / "root", token, f"--ca-file={fifo}"))
    assert done.returncode == 2, done.stderr
    assert f"the CA file {fifo} is a FIFO" in done.stderr


def test_reset_removes_nothing_the_record_names_outside_the_join(tmp_path: Path, token: Path) -> None:
    """A join.json naming other files and directories (edited, or forged) makes reset remove only the join's own."""
    root = tmp_path / "root"
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data").write_text("keep me\n")
    (tmp_path / "precious.txt").write_text("keep me too\n")
    _join(root, token)
    record = Layout(root).record
    entries = json.loads(record.read_text())
    entries["files"].append(str(tmp_path / "precious.txt"))
    entries["directories"].append(str(precious))
    entries["parents"].append(str(tmp_path))
    record.write_text(json.dumps(entries))
    assert main(["edge", "reset", f"--root={root}"]) == 0
    assert (precious / "data").read_text() == "keep me\n"
    assert (tmp_path / "precious.txt").read_text() == "keep me too\n"
    assert not root.exists() or _tree(root) == []


def test_reset_keeps_what_an_admin_added_to_the_configuration_directory(
    tmp_path: Path, token: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file join did not write stays, with the directory holding it, and reset says so."""
    root = tmp_path / "root"
    _join(root, token)
    notes = Layout(root).config_dir / "site-notes.txt"
    notes.write_text("the admin's\n")
    assert main(["edge", "reset", f"--root={root}"]) == 0
    assert notes.read_text() == "the admin's\n"
    assert _tree(root) == ["etc", "etc/nodetaskd", "etc/nodetaskd/site-notes.txt"]
    assert f"kept {notes.parent}: it holds what join did not write (site-notes.txt)" in capsys.readouterr().out


def test_reset_of_a_linked_data_directory_removes_the_link_and_finishes(
    tmp_path: Path, token: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A data directory moved elsewhere and linked back loses the link only; reset does everything else too."""
    root = tmp_path / "root"
    _join(root, token)
    data_dir = Layout(root).data_dir
    moved = tmp_path / "disk" / "nodetaskd"
    moved.parent.mkdir()
    data_dir.rename(moved)
    (moved / "store.sqlite").write_bytes(b"state")
    data_dir.symlink_to(moved)
    assert main(["edge", "reset", f"--root={root}"]) == 0
    assert (moved / "store.sqlite").read_bytes() == b"state"
    assert not root.exists() or _tree(root) == []
    assert f"removed the link {data_dir} (kept {moved}, which it points to)" in capsys.readouterr().out


def test_reset_follows_no_link_out_of_the_root(tmp_path: Path, token: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files reached through a link that leads out of the root are kept: reset removes only inside the root."""
    root = tmp_path / "root"
    _join(root, token)
    elsewhere = tmp_path / "elsewhere-etc"
    (root / "etc").rename(elsewhere)
    (root / "etc").symlink_to(elsewhere)
    assert main(["edge", "reset", f"--root={root}"]) == 0
    assert (elsewhere / "nodetaskd" / "edge.yaml").exists()
    assert (elsewhere / "nodetaskd" / "token").exists()
    assert (elsewhere / "nodetaskd" / "join.json").exists()
    assert (elsewhere / "systemd" / "system" / "nodetaskd-edge.service").exists()
    assert (
        f"kept {root / 'etc' / 'nodetaskd' / 'token'}: it lies in {elsewhere / 'nodetaskd'}" in capsys.readouterr().out
    )
    assert not Layout(root).data_dir.exists()


def test_reset_keeps_a_directory_found_where_join_wrote_a_file(
    tmp_path: Path, token: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reset removes files where join wrote files: a directory found there instead is kept, and reset says so."""
    root = tmp_path / "root"
    _join(root, token)
    layout = Layout(root)
    layout.unit.unlink()
    layout.unit.mkdir()  # unlink() of a directory fails
    (layout.unit / "x").write_text("x")
    assert main(["edge", "reset", f"--root={root}"]) == 0
    assert f"kept {layout.unit}: a directory, where join wrote a file" in capsys.readouterr().out


def test_join_asks_the_hubs_after_every_local_check_and_writes_nothing_when_they_refuse(
    tmp_path: Path, token: Path
) -> None:
    """The probe gets the node, the token and the CA's PEM; a bad token file is refused before it is asked; its
    refusal leaves the root empty; its lines come first in what join prints."""
    asked: list[tuple[tuple[str, ...], str, str, str | None]] = []

    def refuse(hubs: tuple[str, ...], *, node: str, token: str, ca: str | None) -> list[str]:
        asked.append((hubs, node, token, ca))
        raise JoinError("hub wss://hub.example:10004 refused the token for node edge-1 (403: no)")

    ca = tmp_path / "ca.crt"
    ca.write_bytes(generate_serving_certificate(tmp_path / "tls", dns_names=["hub.example"]).ca_bundle)
    empty = tmp_path / "empty.token"
    empty.write_text("")
    with pytest.raises(JoinError, match="is empty"):
        _join(tmp_path / "root", empty, probe=refuse)
    assert asked == []
    with pytest.raises(JoinError, match="refused the token"):
        _join(tmp_path / "root", token, ca_file=ca, probe=refuse)
    ((hubs, node, sent, pem),) = asked
    assert (hubs, node, sent) == (("wss://hub.example:10004",), "edge-1", TOKEN)
    assert pem is not None
    assert pem.startswith("-----BEGIN CERTIFICATE-----")
    assert not (tmp_path / "root").exists()
    done = _join(tmp_path / "root", token, probe=lambda hubs, **_: ["hub checked"])
    assert done[0] == "hub checked"
    assert Layout(tmp_path / "root").config.exists()


def test_a_hub_that_cannot_be_reached_is_only_noted_unless_none_can_be() -> None:
    """A closed port is unreachable (not a mistake); with every hub unreachable join stops, naming --no-hub-check;
    a refusal anywhere stops it whatever the others said."""
    port = free_port()  # nothing listens there
    (answer,) = probe_hubs([f"wss://127.0.0.1:{port}"], node="edge-1", token=TOKEN, ca=None, timeout=5)
    assert answer.outcome is Outcome.UNREACHABLE
    assert "refused" in answer.detail.lower()
    with pytest.raises(JoinError, match=r"no hub could be reached.*--no-hub-check"):
        verdict([answer])
    accepted = HubAnswer("wss://b:10004", Outcome.ACCEPTED)
    lines = verdict([answer, accepted])
    assert lines[0].startswith(f"hub wss://127.0.0.1:{port}: not reachable now")
    assert lines[1] == "hub wss://b:10004: certificate verified, token accepted for this node"
    refused = HubAnswer("wss://c:10004", Outcome.REFUSED, "refused the token for node edge-1 (403: not its token)")
    with pytest.raises(JoinError, match=r"hub wss://c:10004 refused the token .*nothing was written"):
        verdict([accepted, refused])
