"""The entry point validates role, flags and config file, and fails with one line naming the problem."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from roles.cli.main import main


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures structlog for the process; later tests must not log into a closed capture."""
    yield
    structlog.reset_defaults()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "roles.cli", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_unknown_role_exits_2_with_one_line() -> None:
    """An unknown role is refused with exit status 2 and a single line on stderr."""
    done = _run("--role=hub")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0
    assert "invalid choice: 'hub'" in done.stderr


def test_version_prints_the_package_version_and_exits_0() -> None:
    """``nodetaskd --version`` prints the installed package's version and needs no role."""
    done = _run("--version")
    assert (done.returncode, done.stdout, done.stderr) == (
        0,
        f"nodetaskd {importlib.metadata.version('nodetaskd')}\n",
        "",
    )


def test_check_config_merges_file_and_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Flags override the config file and the effective configuration is printed."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text("nodeName: from-file\nmaxDiskUsage: 90\nhubUrls: [wss://hub-a:10004]\n")
    assert main(["--role=edge", f"--config={cfg}", "--node-name=edge-9", "--check-config"]) == 0
    effective = json.loads(capsys.readouterr().out)
    assert effective["nodeName"] == "edge-9"
    assert effective["maxDiskUsage"] == 90
    assert effective["hubUrls"] == ["wss://hub-a:10004"]


def test_cloudhub_is_an_alias_of_cloud(capsys: pytest.CaptureFixture[str]) -> None:
    """--role=cloudhub loads the cloud role's configuration."""
    assert main(["--role=cloudhub", "--listen=127.0.0.1:1", "--check-config"]) == 0
    assert json.loads(capsys.readouterr().out)["listen"] == "127.0.0.1:1"


@pytest.mark.parametrize(
    ("content", "args", "message"),
    [
        ("nodeName: [a, b]\n", ["--role=edge"], "Expected `str`, got `array` - at `$.nodeName`"),
        ("bogus: 1\n", ["--role=cloud"], "unknown field `bogus`"),
        ("maxCpuUsage: 120\n", ["--role=edge"], "Expected `float` <= 100.0 - at `$.maxCpuUsage`"),
        ("featureGates: [warpDrive]\n", ["--role=controller"], "unknown gate(s) warpDrive"),
        ("imageSecretNamespaces: [Team_A]\n", ["--role=cloud"], "imageSecretNamespaces: 'Team_A' is not a namespace"),
        ("- a\n- b\n", ["--role=edge"], "must be a mapping of options"),
        ("a: [\n", ["--role=edge"], "is not valid YAML"),
        ("", ["--role=edge", "--listen=0:1"], "--listen does not apply to the edge role"),
        ("", ["--role=edge", "--hub-url=http://x"], "'http://x' is not a ws:// or wss:// URL"),
        ("criEndpoint: tcp://127.0.0.1:1\n", ["--role=edge"], "criEndpoint 'tcp://127.0.0.1:1' is not a unix socket"),
        ("nodeName: Edge_1\n", ["--role=edge"], "nodeName 'Edge_1' is not a Kubernetes node name"),
        ("nodeName: x/../y\n", ["--role=edge"], "nodeName 'x/../y' is not a Kubernetes node name"),
    ],
)
def test_bad_config_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, args: list[str], message: str
) -> None:
    """An invalid file or flag ends the process with exit status 2 and one line that names it."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(content)
    assert main([*args, f"--config={cfg}"]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


def test_missing_config_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A config path that does not exist is reported with the path."""
    assert main(["--role=edge", f"--config={tmp_path / 'nope.yaml'}"]) == 2
    assert "cannot read config" in capsys.readouterr().err


def test_edge_without_a_readable_token_file_exits_2_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A setting checked only at start (the token file) still ends in one line and exit status 2."""
    missing = tmp_path / "token"
    args = ["--role=edge", "--node-name=e1", "--hub-url=ws://127.0.0.1:1", f"--data-dir={tmp_path}"]
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"tokenFile: {missing}\n")
    assert main([*args, f"--config={cfg}"]) == 2
    assert f"cannot read tokenFile {missing}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "says"), [(None, "cannot read caFile {}: No such file"), ("x", "caFile {} holds no")]
)
def test_edge_with_a_missing_or_non_pem_ca_file_exits_2_naming_it(
    tmp_path: Path, content: str | None, says: str
) -> None:
    """An unusable caFile ends the agent at start with one line naming the setting and the path, no traceback."""
    ca = tmp_path / "ca.pem"
    if content is not None:
        ca.write_text(content)
    (tmp_path / "token").write_text("t")
    cfg = tmp_path / "edge.yaml"
    cfg.write_text(f"nodeName: e1\nhubUrls: [wss://127.0.0.1:1]\ntokenFile: {tmp_path / 'token'}\ncaFile: {ca}\n")
    done = _run("--role=edge", f"--config={cfg}", f"--data-dir={tmp_path}")
    assert done.returncode == 2
    assert done.stderr.startswith(f"nodetaskd: error: {says.format(ca)}")
    assert done.stderr.count("\n") == 1


@pytest.mark.parametrize("role", ["controller", "cloud"])
def test_cloud_role_without_the_cloud_extra_names_the_extra_and_the_missing_module(role: str) -> None:
    """On a base (device) install the cloud roles exit 3 saying which extra to install, instead of a traceback."""
    code = (
        "import sys; sys.modules['kubernetes_asyncio'] = None; "  # as if the cloud extra were not installed
        f"from roles.cli.main import main; sys.exit(main(['--role={role}', '--kubeconfig=/nonexistent']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 3, done.stderr
    assert "pip install 'nodetaskd[cloud]'" in done.stderr
    assert "module kubernetes_asyncio is not installed" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_missing_module_that_is_not_the_cloud_extras_keeps_its_traceback() -> None:
    """Only the cloud extra's modules are explained; any other missing module is a bug and fails loudly."""
    code = (
        "import sys; sys.modules['roles.cloud'] = None; "  # as if the package itself were missing
        "from roles.cli.main import main; sys.exit(main(['--role=cloud', '--kubeconfig=/nonexistent']))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1, done.stderr
    assert "ModuleNotFoundError" in done.stderr
    assert "cloud extra" not in done.stderr


def test_token_create_refuses_to_overwrite_a_token_file_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An existing file is refused before the API server is asked (a rotated token must not be lost), naming --force."""
    existing = tmp_path / "edge-1.token"
    existing.write_text("the previous token\n")
    status = main(["token", "create", "edge-1", f"--token-file={existing}", "--kubeconfig=/nonexistent/kubeconfig"])
    assert status == 2
    assert (
        capsys.readouterr().err
        == f"nodetaskd: error: {existing} exists: give --force to overwrite it, or another --token-file\n"
    )
    assert existing.read_text() == "the previous token\n"


def test_help_lists_every_role_and_command(capsys: pytest.CaptureFixture[str]) -> None:
    """nodetaskd --help has a line for each role and for each command beside them (ctl, edge, token, certs)."""
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    named = {words[0] for words in lines if len(words) > 1}
    assert {"--role=controller", "--role=cloud", "--role=edge", "ctl", "edge", "token", "certs"} <= named


@pytest.mark.parametrize("check", [True, False], ids=["check-config", "start"])
def test_a_config_giving_a_key_twice_is_refused_naming_the_key_and_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: bool
) -> None:
    """A role config with a duplicate key exits 2 at start and with --check-config, naming the key and its lines."""
    cfg = tmp_path / "edge.yaml"
    cfg.write_text("nodeName: edge-1\nmaxDiskUsage: 90\nlocalApi:\n  enabled: true\n  enabled: false\n")
    assert main(["--role=edge", f"--config={cfg}", *(["--check-config"] if check else [])]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"nodetaskd: error: config {cfg}: duplicate key 'enabled' at line 5 (first given at line 4):"
        " a key may appear once in a mapping\n"
    )


UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: not-a-token}
contexts:
- name: c
  context: {cluster: c, user: u}
current-context: c
"""
"""A kubeconfig naming a server on a loopback port nothing listens on (port 1 needs root to bind)."""


@pytest.mark.parametrize(
    ("kubeconfig", "cause"),
    [
        (None, "no kubeconfig was given, and this is not a pod with a ServiceAccount"),
        ("missing", "kubeconfig {path} does not exist"),
        (UNREACHABLE_KUBECONFIG, "Cannot connect to host 127.0.0.1:1"),
        ("apiVersion: v1\nclusters: [\n", "kubeconfig {path} is not usable: while parsing a flow node"),
        ("just a string\n", "kubeconfig {path} is not a kubeconfig (a mapping of clusters, users and contexts)"),
    ],
    ids=["none", "missing", "unreachable", "malformed", "not-a-mapping"],
)
@pytest.mark.parametrize("command", [["ctl", "get"], ["token", "create", "edge-1", "--token-file=-"]], ids=" ".join)
def test_kubeconfig_and_api_errors_are_one_line_naming_the_cause_with_exit_3(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: list[str],
    kubeconfig: str | None,
    cause: str,
) -> None:
    """No kubeconfig, a missing, malformed or unreachable one: exit status 3 and one line naming the cause."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "kubeconfig"
    if kubeconfig not in (None, "missing"):
        path.write_text(kubeconfig)
    flags = [] if kubeconfig is None else [f"--kubeconfig={path}"]
    assert main([*command, *flags]) == 3
    err = capsys.readouterr().err
    assert err.startswith("nodetaskd: error: ")
    assert err.count("\n") == 1, err
    assert cause.format(path=path) in err


@pytest.mark.parametrize("role", ["controller", "cloud"])
def test_a_role_whose_kubeconfig_is_missing_exits_3_with_one_line(tmp_path: Path, role: str) -> None:
    """A controller or hub started with a kubeconfig that does not exist ends at once: one line, exit status 3."""
    missing = tmp_path / "kubeconfig"
    done = _run(f"--role={role}", f"--kubeconfig={missing}", "--log-level=error")
    assert done.returncode == 3, done.stderr
    assert done.stderr == f"nodetaskd: error: kubeconfig {missing} does not exist\n"


@pytest.mark.parametrize(
    ("arguments", "index"),
    [
        (["ctl", "get"], 0),
        (["--kubeconfig", "k", "ctl", "get"], 2),
        (["--kubeconfig=k", "--context", "c", "token", "create", "n"], 3),
        (["--context=c", "certs", "create"], 1),
        (["-n", "ops", "ctl", "get", "diagnosis"], 2),
        (["-nops", "--namespace=x", "ctl", "get"], 2),
        (["--role=edge"], None),
        (["--kubeconfig", "k", "--role=cloud"], None),
        (["--kubeconfig"], None),
        ([], None),
    ],
)
def test_the_command_is_found_past_the_options_kubectl_takes_before_it(arguments: list[str], index: int | None) -> None:
    """--kubeconfig and --context (with their values, either way) may come before a command's name; a role's
    flags may not, so those arguments stay a role's."""
    from roles.cli.commands import command_index

    assert command_index(arguments) == index


@pytest.mark.parametrize(
    ("arguments", "kubeconfig", "context"),
    [
        (["--kubeconfig=a", "--context=c", "ctl", "get"], "a", "c"),
        (["ctl", "get", "--kubeconfig=b", "--context=d"], "b", "d"),
        (["--kubeconfig=a", "ctl", "get", "--kubeconfig=b"], "b", None),
        (["ctl", "nodes"], None, None),
    ],
)
def test_global_options_before_or_after_the_command_reach_it_the_later_one_winning(
    arguments: list[str], kubeconfig: str | None, context: str | None
) -> None:
    """The value given after the command replaces the one given before it, as kubectl's flags do."""
    from roles.cli.commands import _parser

    args = _parser().parse_args(arguments)
    assert (args.kubeconfig, args.context) == (kubeconfig, context)


@pytest.mark.parametrize(
    ("arguments", "namespace"),
    [
        (["-n", "a", "ctl", "get", "diagnosis"], "a"),
        (["ctl", "get", "diagnosis", "-n", "b"], "b"),
        (["--namespace=a", "ctl", "describe", "diagnosis/x", "--namespace", "c"], "c"),
        (["-n", "a", "token", "create", "edge-1"], "a"),
        (["certs", "create"], None),
    ],
)
def test_the_namespace_flag_goes_before_or_after_the_command(arguments: list[str], namespace: str | None) -> None:
    """-n/--namespace reaches every command that takes one from either side, the later one winning."""
    from roles.cli.commands import _parser

    assert _parser().parse_args(arguments).namespace == namespace


def test_the_namespace_defaults_to_the_kubeconfig_contexts_as_kubectl_picks_it(tmp_path: Path) -> None:
    """-n wins; else the namespace of --context's context, else the current context's, else default."""
    import argparse

    from roles.cli.with_api import namespace_of

    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "current-context: ops\n"
        "contexts:\n"
        "- {name: ops, context: {cluster: c, user: u, namespace: operations}}\n"
        "- {name: bare, context: {cluster: c, user: u}}\n"
    )

    def pick(**given: str | None) -> str:
        return namespace_of(argparse.Namespace(kubeconfig=str(kubeconfig), **{"context": None, **given}))

    assert pick() == "operations"
    assert pick(namespace="given") == "given"
    assert pick(context="bare") == "default"
    kubeconfig.write_text("not: [valid\n")
    assert pick() == "default"  # the API client then says what is wrong with the file
