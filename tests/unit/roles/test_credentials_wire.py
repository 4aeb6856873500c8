"""Registry credentials from hub to agent: typed for agents that say they read them, the old strings otherwise.

A hub (whole, over memory links: :mod:`tests.unit.roles.cloud.doubles`) sends a new agent the typed form and
an old one the strings; the agent's side, new or old hub, is in :mod:`tests.unit.roles.edge.test_agent`.
"""

from __future__ import annotations

import base64
import json

import msgspec
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from rich.pretty import pretty_repr

from nodetask.messages import RunAction
from nodetask.phases import NodeTaskPhase
from nodetask.registry_credentials import TYPED_CREDENTIALS, RegistryAuth
from roles.common.registry_auth import credentials_of, decode_credentials, encode_credentials
from roles.kube.resources import SECRETS
from schemas.core import Secret
from schemas.meta import ObjectMeta
from tests.unit.roles.cloud.doubles import PREPULLS, MemoryApi, edge_nodes, prepull_job, running_hub
from tests.unit.roles.edge.doubles import AUTH, IMAGE, OLD_FORM, run_action


def _job_with_secret(api: MemoryApi, nodes: list[str]) -> None:
    """A pre-pull of :data:`IMAGE` on ``nodes`` whose ``imageSecrets`` Secret holds :data:`AUTH`."""
    config = {"auths": {"registry.example": {"username": "puller", "password": "s3cret"}}}
    api.put(
        SECRETS,
        Secret(
            metadata=ObjectMeta(name="regcred", namespace="kube-system"),
            type="kubernetes.io/dockerconfigjson",
            data={".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()},
        ),
    )
    job = prepull_job("creds", "uid-creds", [(n, NodeTaskPhase.PENDING) for n in nodes], concurrency=len(nodes))
    template = msgspec.structs.replace(job.spec.image_pre_pull_template, image_secrets="kube-system/regcred")
    api.put(
        PREPULLS, msgspec.structs.replace(job, spec=msgspec.structs.replace(job.spec, image_pre_pull_template=template))
    )


# ------------------------------------------------------------------------------------------- the hub


async def test_a_hub_sends_each_agent_the_form_of_credentials_it_reads(autojump_clock: trio.testing.MockClock) -> None:
    """An agent advertising the capability gets the typed credentials only; one without it gets the old strings."""
    api = MemoryApi()
    edge_nodes(api, "new", "old")
    _job_with_secret(api, ["new", "old"])
    async with running_hub(api) as (_, door):
        new, old = door.connect("new"), door.connect("old")
        await new.hello(capabilities=(TYPED_CREDENTIALS,))
        await old.hello()
        typed = await new.next_of(RunAction)
        assert (typed.registry_credentials, typed.credentials) == ({IMAGE: AUTH}, {})
        # Read as an old agent would: the frame's strings, which it decodes itself.
        frame = msgspec.json.decode(await old.link.receive())
        assert frame["op"] == "run_action"
        assert frame["credentials"] == {IMAGE: OLD_FORM}
        assert not frame.get("registryCredentials")


# -------------------------------------------------------------------------------- the two forms, pure


def test_a_string_no_hub_would_send_fails_the_jobs_pulls_naming_its_image() -> None:
    """An undecodable string becomes the job's credentials reason rather than an anonymous pull."""
    run = msgspec.structs.replace(run_action("a"), credentials={IMAGE: "not json"})
    assert credentials_of(run) == ({}, f"the hub's credentials for {IMAGE}: credentials are not JSON: Expecting value")


def test_typed_credentials_win_over_strings_for_the_same_image_and_the_hubs_reason_is_kept() -> None:
    """A frame with both forms reads the typed one; the hub's reason for having none passes through."""
    other = RegistryAuth("registry.example", "other", "pw")
    run = msgspec.structs.replace(
        run_action("a"),
        registry_credentials={IMAGE: AUTH},
        credentials={IMAGE: encode_credentials(other), "b/c:1": encode_credentials(other)},
        credentials_error="why not",
    )
    assert credentials_of(run) == ({IMAGE: AUTH, "b/c:1": other}, "why not")


def test_no_repr_of_a_run_action_shows_a_password_or_token() -> None:
    """Logging a RunAction by mistake, plainly or through rich, names the registry and user, never the secrets."""
    auth = RegistryAuth("reg", "alice", "hunter2", identity_token="idtok", registry_token="regtok")
    run = msgspec.structs.replace(run_action("a"), registry_credentials={IMAGE: auth})
    text = repr(run) + pretty_repr(run) + pretty_repr(auth)
    assert "alice" in text
    for secret in ("hunter2", "idtok", "regtok"):
        assert secret not in text


secrets = st.text(max_size=12)


@given(st.builds(RegistryAuth, st.text(min_size=1, max_size=12), secrets, secrets, secrets, secrets))
def test_the_string_form_round_trips(auth: RegistryAuth) -> None:
    """What a new hub encodes for an old agent decodes back to the same credentials."""
    assert decode_credentials(encode_credentials(auth)) == auth
