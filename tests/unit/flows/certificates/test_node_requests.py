"""The controller approves a hub's request for a node's certificate only when everything is exactly a kubelet's for
that edge node, denies it naming what is not, and leaves anyone else's requests alone."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from flows.certificates.node_requests import (
    APPROVE_REASON,
    DENY_REASON,
    Hubs,
    RequestFacts,
    Subject,
    ours,
    request_problems,
    subject_problem,
    verdict,
)
from schemas.certificates import (
    APPROVED,
    DENIED,
    KUBELET_CLIENT_SIGNER,
    NODE_LABEL,
    NODE_USAGES,
    CertificateSigningRequest,
    CertificateSigningRequestCondition,
    CertificateSigningRequestSpec,
    CertificateSigningRequestStatus,
)
from schemas.meta import ObjectMeta

HUBS = Hubs(users=frozenset({"hub-user"}), groups=frozenset({"nodetaskd:clouds"}))
GOOD = RequestFacts(subject=Subject(common_names=("system:node:edge-1",), organizations=("system:nodes",)))
SECRET = "kube-system/nodetaskd-edge-edge-1"


def csr(
    *,
    labels: dict[str, str] | None = None,
    usages: tuple[str, ...] = NODE_USAGES,
    signer: str = KUBELET_CLIENT_SIGNER,
    username: str = "someone",
    groups: tuple[str, ...] = ("nodetaskd:clouds", "system:authenticated"),
    conditions: tuple[str, ...] = (),
) -> CertificateSigningRequest:
    return CertificateSigningRequest(
        metadata=ObjectMeta(name="nodetaskd-edge-1-ab12", labels={NODE_LABEL: "edge-1"} if labels is None else labels),
        spec=CertificateSigningRequestSpec(
            request="", signer_name=signer, usages=usages, username=username, groups=groups
        ),
        status=CertificateSigningRequestStatus(
            conditions=tuple(CertificateSigningRequestCondition(type=c, status="True") for c in conditions)
        ),
    )


def test_a_hubs_exact_request_for_an_edge_node_is_approved_naming_nodetaskd() -> None:
    """Everything as a kubelet's for the labelled node, and the node's token Secret there: approved, by nodetaskd."""
    decided = verdict(csr(), GOOD, token_found=True, token_secret=SECRET)
    assert decided.approved
    assert decided.reason == APPROVE_REASON
    assert "nodetaskd" in decided.message


def test_usages_in_another_order_are_still_exactly_the_three() -> None:
    """The usages are a set: their order does not matter, as long as they are the three."""
    decided = verdict(csr(usages=tuple(reversed(NODE_USAGES))), GOOD, token_found=True, token_secret=SECRET)
    assert decided.approved


def test_a_node_without_a_join_token_is_denied_naming_the_secret() -> None:
    """A node nodetaskd does not serve (no token Secret) gets no certificate, whoever asks: the denial says why."""
    decided = verdict(csr(), GOOD, token_found=False, token_secret=SECRET)
    assert not decided.approved
    assert decided.reason == DENY_REASON
    assert SECRET in decided.message


def test_a_request_that_cannot_be_read_is_denied_with_the_reason() -> None:
    """An unreadable PKCS#10 request is denied, and the denial repeats why it could not be read."""
    decided = verdict(csr(), "its signature does not verify", token_found=True, token_secret=SECRET)
    assert not decided.approved
    assert "its signature does not verify" in decided.message


def test_a_request_without_the_node_label_is_denied() -> None:
    """Without the label naming the node there is no node to check the subject against: denied."""
    decided = verdict(csr(labels={}), GOOD, token_found=False, token_secret="")
    assert not decided.approved
    assert NODE_LABEL in decided.message


names = st.sampled_from(["edge-1", "edge-2", "edge-1.x", "master-1", "", "Edge-1", "edge_1"])
common_names = st.lists(
    st.sampled_from(["system:node:edge-1", "system:node:edge-2", "system:admin", "edge-1", ""]), max_size=2
).map(tuple)
organizations = st.lists(st.sampled_from(["system:nodes", "system:masters", "nodetaskd:clouds", ""]), max_size=2).map(
    tuple
)
others = st.lists(st.sampled_from(["OU=x", "C=DE", "1.2.3.4=#0000"]), max_size=1).map(tuple)
usage_sets = st.lists(st.sampled_from([*NODE_USAGES, "server auth", "cert sign", "signing"]), max_size=4).map(tuple)
alt_names = st.lists(st.sampled_from(["edge-1", "10.0.0.1", "kubernetes"]), max_size=1).map(tuple)
key_problems = st.sampled_from(["", "", "its RSA key has 1024 bits, fewer than 2048"])


@given(
    label=names,
    cns=common_names,
    orgs=organizations,
    other=others,
    usages=usage_sets,
    alts=alt_names,
    key=key_problems,
    token=st.booleans(),
)
def test_any_mismatch_of_subject_usages_label_or_token_is_denied(
    label: str,
    cns: tuple[str, ...],
    orgs: tuple[str, ...],
    other: tuple[str, ...],
    usages: tuple[str, ...],
    alts: tuple[str, ...],
    key: str,
    token: bool,
) -> None:
    """Approved exactly when label, subject, alternative names, key, usages and token are all a kubelet's for one
    edge node; any one thing off denies the request, and a denial is never empty of reasons."""
    facts = RequestFacts(subject=Subject(cns, orgs, other), alt_names=alts, key_problem=key)
    decided = verdict(csr(labels={NODE_LABEL: label}, usages=usages), facts, token_found=token, token_secret=SECRET)
    exact = (
        label in ("edge-1", "edge-2", "edge-1.x", "master-1")
        and cns == (f"system:node:{label}",)
        and orgs == ("system:nodes",)
        and not other
        and not alts
        and not key
        and sorted(usages) == sorted(NODE_USAGES)
        and token
    )
    assert decided.approved == exact
    if not exact:
        assert decided.reason == DENY_REASON
        assert decided.message.startswith("nodetaskd denies it: ")
        assert len(decided.message) > len("nodetaskd denies it: ")


def test_the_subject_of_another_node_names_both() -> None:
    """A subject for another node is a mismatch that says which common name it has and which it should have."""
    problem = subject_problem(Subject(("system:node:edge-2",), ("system:nodes",)), "edge-1")
    assert "'system:node:edge-2'" in problem
    assert "'system:node:edge-1'" in problem


def test_the_hub_finds_nothing_wrong_with_its_own_nodes_request() -> None:
    """request_problems, the hub's check, is empty for the session's node and names the subject for another."""
    assert request_problems(GOOD, "edge-1") == []
    assert request_problems(GOOD, "edge-2") != []


def test_only_pending_requests_of_a_hub_for_the_kubelet_client_signer_are_the_controllers() -> None:
    """Requests of other requesters or signers, and decided ones, are left alone (kcm's approver has its own)."""
    assert ours(csr(), HUBS)
    assert ours(csr(username="hub-user", groups=()), HUBS)
    assert not ours(csr(groups=("system:authenticated",)), HUBS)
    assert not ours(csr(username="system:node:edge-1", groups=("system:nodes",)), HUBS)
    assert not ours(csr(signer="kubernetes.io/kube-apiserver-client"), HUBS)
    assert not ours(csr(conditions=(APPROVED,)), HUBS)
    assert not ours(csr(conditions=(DENIED,)), HUBS)
