"""Which settings a ConfigUpdateJob may change: one allowlist, refused alike by the webhook and the agent."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask.route import Route
from roles.common.config import ConfigError, ControllerConfig, EdgeConfig
from roles.controller.admission.reviews import admission_policy
from roles.edge.checks.checks import Thresholds
from roles.edge.config_update import config_update
from roles.edge.context import TaskContext
from roles.edge.settings import client_tls
from roles.edge.store.store import EdgeStore, open_store
from schemas.checker import FieldError
from schemas.update_fields import MAX_KEY_DEPTH, MAX_KEY_LENGTH, key_problem
from schemas.v1alpha2 import ConfigUpdateJobSpec
from schemas.validation import validate_create

POLICY = admission_policy(ControllerConfig())
NEVER = (
    "nodeName",
    "hubUrls",
    "hubUrls[0]",
    "hubUrls[1]",
    "tokenFile",
    "caFile",
    "dataDir",
    "criEndpoint",
    "upgradeImage",
    "insecureRegistries",
    "insecureRegistries[0]",
)
"""Identity, connection, credentials, TLS, paths, the runtime, where code and images come from."""


def job(fields: Mapping[str, object]) -> dict[str, object]:
    spec = {"updateFields": fields, "nodeNames": ["edge-1"]}
    return {"apiVersion": "operations.kubeedge.io/v1alpha2", "kind": "ConfigUpdateJob", "metadata": {}, "spec": spec}


def messages(errors: tuple[FieldError, ...]) -> list[str]:
    return [str(e) for e in errors]


# ---------------------------------------------------------------------------------------------- allowlist


def test_every_updatable_field_is_an_edge_setting_and_none_is_sensitive() -> None:
    """The allowlist names settings of the edge configuration, and no identity, connection, credential or path."""
    settings = {field.encode_name for field in msgspec.structs.fields(EdgeConfig)}
    assert EdgeConfig.UPDATABLE_FIELDS.issubset(settings)
    assert EdgeConfig.UPDATABLE_FIELDS.isdisjoint(NEVER)
    assert {"maxCpuUsage", "logLevel", "configUpdateHealthDeadline"} <= EdgeConfig.UPDATABLE_FIELDS


@pytest.mark.parametrize("key", NEVER)
def test_a_sensitive_key_is_refused_naming_it_and_the_allowed_set(key: str) -> None:
    """The refusal names the key and lists every setting that may be changed instead."""
    problem = key_problem(key, EdgeConfig.UPDATABLE_FIELDS)
    assert problem.startswith(f"{key} is not a setting a ConfigUpdateJob may change")
    assert ", ".join(sorted(EdgeConfig.UPDATABLE_FIELDS)) in problem


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("a" * 30_000, f"a field path of 30000 characters is longer than the {MAX_KEY_LENGTH} allowed"),
        (".".join(["a"] * 3_000), f"a field path of 5999 characters is longer than the {MAX_KEY_LENGTH} allowed"),
        (".".join(["a"] * 60), f"a field path of 60 parts is deeper than the {MAX_KEY_DEPTH} allowed"),
        ("a[0]" * 20, f"a field path of 21 parts is deeper than the {MAX_KEY_DEPTH} allowed"),
        ("", "field paths must not be empty"),
    ],
)
def test_long_deep_and_empty_keys_are_refused_before_anything_parses_them(key: str, says: str) -> None:
    """Length and depth are bounded first, and the message does not repeat the key."""
    assert key_problem(key, EdgeConfig.UPDATABLE_FIELDS) == says


@given(st.text(max_size=60))
def test_only_listed_keys_pass(key: str) -> None:
    """Any key passes exactly when it is one of the updatable settings; nothing raises."""
    assert (key_problem(key, EdgeConfig.UPDATABLE_FIELDS) == "") == (key in EdgeConfig.UPDATABLE_FIELDS)


# ---------------------------------------------------------------------------------------------- webhook


def test_the_webhook_refuses_a_hub_url_token_and_ca_update_naming_each_key() -> None:
    """Each refused key gets its own error at its path, listing the allowed settings."""
    errors = validate_create(
        job({"hubUrls[0]": "ws://rogue:1", "tokenFile": "/dev/sda", "caFile": "/nonexistent"}), policy=POLICY
    )
    assert [e.path for e in errors] == [
        "spec.updateFields['hubUrls[0]']",
        "spec.updateFields['tokenFile']",
        "spec.updateFields['caFile']",
    ]
    for error in errors:
        assert "is not a setting a ConfigUpdateJob may change: only configUpdateHealthDeadline, " in error.message


def test_a_huge_key_gets_a_short_message() -> None:
    """A 3,000-segment key is refused with a message of bounded size, its path cut short."""
    key = ".".join(["x"] * 3_000)
    (error,) = validate_create(job({key: "1"}), policy=POLICY)
    assert "longer than the 128 allowed" in error.message
    assert error.path.startswith("spec.updateFields['x.x.x")
    assert len(str(error)) < 200


@pytest.mark.parametrize(
    ("fields", "path", "says"),
    [
        ({"maxCpuUsage": "lots"}, "spec.updateFields['maxCpuUsage']", "Expected `float`, got `str`"),
        ({"maxCpuUsage": "101"}, "spec.updateFields['maxCpuUsage']", "Expected `float` <= 100.0"),
        ({"logLevel": "loud"}, "spec.updateFields", "logLevel 'loud' is not one of debug, info, warning, error"),
    ],
)
def test_the_webhook_types_values_as_the_agent_does(fields: dict[str, object], path: str, says: str) -> None:
    """Values are typed as keadm's --set types them and must fit the edge setting they change."""
    (error,) = validate_create(job(fields), policy=POLICY)
    assert (error.path, says in error.message) == (path, True)


def test_valid_operational_updates_are_admitted() -> None:
    """Thresholds, deadlines and log settings may be changed."""
    fields = {"maxCpuUsage": "95", "logLevel": "debug", "configUpdateHealthDeadline": "30"}
    assert validate_create(job(fields), policy=POLICY) == ()


def test_without_a_policy_no_key_is_admitted() -> None:
    """The default policy is closed: every updateFields key is refused."""
    assert messages(validate_create(job({"maxCpuUsage": "95"}))) == [
        "spec.updateFields['maxCpuUsage']: maxCpuUsage is not a setting a ConfigUpdateJob may change: only none"
        " may be (the node's identity, hub connection, credentials, TLS, paths and container runtime never are)"
    ]


# ---------------------------------------------------------------------------------------------- agent


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[EdgeStore]:
    async with open_store(tmp_path / "store.sqlite") as opened:
        yield opened


async def context(store: EdgeStore, tmp_path: Path, fields: dict[str, str]) -> TaskContext:
    """A ConfigUpdateJob's Check on an agent whose config file is ``tmp_path/edge.yaml``."""
    spec = ConfigUpdateJobSpec(node_names=("edge-1",), update_fields=fields)
    route = Route(api_version="operations.kubeedge.io/v1alpha2", job_type="configupdatejob", job="j", node="edge-1")
    task, _ = await store.add_task(
        job_uid="uid-1",
        route=str(route),
        job_type="configupdatejob",
        spec=msgspec.json.encode(spec),
        run_action_id="r-1",
        action="Check",
    )
    (tmp_path / "token").write_text("secret")
    config = {"nodeName": "edge-1", "hubUrls": ["ws://127.0.0.1:1"], "tokenFile": str(tmp_path / "token")}
    (tmp_path / "edge.yaml").write_bytes(msgspec.yaml.encode(config))
    return TaskContext(
        task=task,
        spec=spec,
        node="edge-1",
        version="v0.1.0",
        data_dir=tmp_path,
        thresholds=Thresholds(cpu=100, mem=100, disk=100),
        store=store,
        config_file=tmp_path / "edge.yaml",
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"hubUrls[0]": "ws://rogue:1", "hubUrls[1]": "ws://rogue:2"},
        {"tokenFile": "/etc/hostname"},
        {"caFile": "/nonexistent"},
        {"maxCpuUsage": "95", "dataDir": "/tmp"},
        {".".join(["a"] * 3_000): "1"},
    ],
)
async def test_the_agent_refuses_the_same_keys_when_the_webhook_did_not_run(
    store: EdgeStore, tmp_path: Path, fields: dict[str, str]
) -> None:
    """Check fails naming the refused key, and the config file stays as it was."""
    ctx = await context(store, tmp_path, fields)
    before = (tmp_path / "edge.yaml").read_bytes()
    outcome = await config_update.check(ctx)
    assert not outcome.succ
    assert outcome.reason.startswith("updateFields refused: ")
    assert any(says in outcome.reason for says in ("is not a setting a ConfigUpdateJob may change", "longer than"))
    assert (tmp_path / "edge.yaml").read_bytes() == before


async def test_the_agent_accepts_an_operational_update(store: EdgeStore, tmp_path: Path) -> None:
    """An allowed key with a fitting value passes Check."""
    outcome = await config_update.check(await context(store, tmp_path, {"maxCpuUsage": "95"}))
    assert outcome.succ, outcome.reason


# ---------------------------------------------------------------------------------------------- caFile


@pytest.mark.parametrize(
    ("content", "says"),
    [(None, "cannot read caFile {path}: No such file or directory"), (b"not a certificate", "caFile {path} holds no")],
)
def test_an_unusable_ca_file_is_a_config_error_naming_the_setting_and_path(
    tmp_path: Path, content: bytes | None, says: str
) -> None:
    """A missing or non-PEM caFile is a ConfigError naming caFile and its path, also for ws:// hubs."""
    path = tmp_path / "ca.pem"
    if content is not None:
        path.write_bytes(content)
    for url in ("wss://127.0.0.1:1", "ws://127.0.0.1:1"):
        with pytest.raises(ConfigError, match="^" + says.format(path=path)):
            client_tls(EdgeConfig(hub_urls=(url,), ca_file=str(path)))
