"""Wire messages round-trip, keep KubeEdge's report keys, tolerate new fields and reject garbage clearly."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodetask import messages as m
from nodetask import relay_messages
from nodetask.nesting import MAX_DEPTH
from nodetask.registry_credentials import RegistryAuth
from nodetask.route import Route

ROUTE = Route("operations.kubeedge.io/v1alpha2", "imageprepulljob", "prepull-1", "edge-7")
text = st.text(max_size=30)

upstream = st.one_of(
    st.builds(m.Hello, node=text, version=text, capabilities=st.lists(text, max_size=3).map(tuple)),
    st.builds(m.Ack, id=text),
    st.builds(
        m.Report,
        route=st.just(ROUTE),
        job_uid=text,
        seq=st.integers(0, 2**62),
        action=text,
        succ=st.booleans(),
        finish_time=text,
        reason=text,
        extend=text,
        attempt=st.integers(0, 2**31 - 1),
    ),
    st.builds(m.Heartbeat, sent_at=st.floats(0, 1e9)),
    st.builds(m.Error, code=text, message=text, ref=text),
    st.builds(m.NodeCredentialsRequest, id=st.text(min_size=1, max_size=64), csr=text),
)
downstream = st.one_of(
    st.builds(m.Welcome, hub=text, heartbeat_interval=st.floats(0.1, 100)),
    st.builds(
        m.RunAction,
        id=text,
        route=st.just(ROUTE),
        job_uid=text,
        action=text,
        spec=st.just(msgspec.Raw(b'{"imagePrePullTemplate":{"images":["busybox"]}}')),
        credentials=st.dictionaries(text, text, max_size=2),
        registry_credentials=st.dictionaries(text, st.builds(RegistryAuth, text, text, text, text, text), max_size=2),
        attempt=st.integers(0, 2**31 - 1),
    ),
    st.builds(m.ReportAck, job_uid=text, seq=st.integers(0, 2**62)),
    st.builds(m.Confirm, route=st.just(ROUTE), job_uid=text, attempt=st.integers(0, 9)),
    st.builds(m.Cancel, route=st.just(ROUTE), job_uid=text, attempt=st.integers(0, 9)),
    st.builds(m.NodeCredentials, id=st.text(max_size=64), certificate=text, ca_bundle=text, error=text),
)


@given(upstream)
def test_upstream_messages_round_trip(msg: m.Upstream) -> None:
    """Every edge-to-cloud message decodes to what was encoded."""
    assert m.decode_upstream(m.encode(msg)) == msg


@given(downstream)
def test_downstream_messages_round_trip(msg: m.Downstream) -> None:
    """Every cloud-to-edge message decodes to what was encoded (raw specs compared as bytes)."""
    decoded = m.decode_downstream(m.encode(msg))
    if isinstance(msg, m.RunAction):
        assert isinstance(decoded, m.RunAction)
        assert bytes(decoded.spec) == bytes(msg.spec)
        assert msgspec.structs.replace(decoded, spec=msg.spec) == msg
    else:
        assert decoded == msg


def test_report_carries_kubeedges_upstream_keys() -> None:
    """The report body has KubeEdge's keys {action, succ, finishTime, reason, extend} and the route string."""
    report = m.Report(
        route=ROUTE,
        job_uid="u1",
        seq=4,
        action="Pull",
        succ=False,
        finish_time="2025-05-28T08:12:01Z",
        reason="there were some failures when pulling images",
        extend="[]",
    )
    wire = msgspec.json.decode(m.encode(report))
    assert wire["op"] == "report"
    assert wire["route"] == "operations.kubeedge.io/v1alpha2/imageprepulljob/prepull-1/nodes/edge-7"
    assert {"action", "succ", "finishTime", "reason", "extend"} <= set(wire)
    body = msgspec.json.decode(m.encode(report.result))
    assert body == {
        "action": "Pull",
        "succ": False,
        "finishTime": "2025-05-28T08:12:01Z",
        "reason": "there were some failures when pulling images",
        "extend": "[]",
    }
    assert m.decode_result(m.encode(report.result)) == report.result


def test_unknown_fields_from_newer_peers_are_ignored() -> None:
    """A frame with fields this version does not know still decodes."""
    frame = b'{"op":"hello","node":"edge-1","version":"v2","capabilities":["prepull"],"zone":"eu","flags":{"x":1}}'
    assert m.decode_upstream(frame) == m.Hello(node="edge-1", version="v2", capabilities=("prepull",))


def test_frames_of_peers_that_know_no_attempts_decode_with_attempt_zero() -> None:
    """A report, RunAction, Cancel or Confirm without an attempt (an older peer) decodes with 0: "not said"."""
    route = str(ROUTE)
    report = m.decode_upstream(
        f'{{"op":"report","route":"{route}","jobUid":"u","seq":1,"action":"Pull","succ":true}}'.encode()
    )
    assert isinstance(report, m.Report)
    assert report.attempt == 0
    run = m.decode_downstream(
        f'{{"op":"run_action","id":"1","route":"{route}","jobUid":"u","action":"Check","spec":{{}}}}'.encode()
    )
    assert isinstance(run, m.RunAction)
    assert run.attempt == 0
    for op in ("cancel", "confirm"):
        msg = m.decode_downstream(f'{{"op":"{op}","route":"{route}","jobUid":"u"}}'.encode())
        assert isinstance(msg, m.Cancel | m.Confirm)
        assert msg.attempt == 0


class _RunActionBeforeAttempts(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", tag_field="op", tag="run_action"
):
    """RunAction as agents built before retries decode it."""

    id: str
    route: str
    job_uid: str
    action: str


def test_an_older_agent_decodes_a_run_action_that_names_its_attempt() -> None:
    """The attempt is an addition with a default: a decoder that does not know it still reads the frame."""
    run = m.RunAction(id="1", route=ROUTE, job_uid="u", action="Check", spec=msgspec.Raw(b"{}"), attempt=2)
    decoded = msgspec.json.decode(m.encode(run), type=_RunActionBeforeAttempts)
    assert (decoded.job_uid, decoded.action) == ("u", "Check")


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (b"not json", "malformed upstream frame: JSON is malformed"),
        (b"{}", "missing required field `op`"),
        (b'{"op":"launch_missiles"}', r"Invalid value 'launch_missiles' - at `\$.op`"),
        (b'{"op":"report","route":"a/b","jobUid":"u","seq":1,"action":"Check","succ":true}', r"at `\$.route`"),
        (
            b'{"op":"report","route":"operations.kubeedge.io/v1alpha2/t/j/nodes/n","jobUid":"u","seq":"1",'
            b'"action":"Check","succ":true}',
            r"Expected `int`, got `str` - at `\$.seq`",
        ),
        (b'{"op":"ack"}', "missing required field `id`"),
        (b'{"op":"run_action","id":"1"}', "Invalid value 'run_action'"),
    ],
)
def test_malformed_upstream_frames_raise_a_named_error(frame: bytes, message: str) -> None:
    """Garbage becomes a MessageError saying what and where, which the hub can answer with an Error frame."""
    with pytest.raises(m.MessageError, match=message):
        m.decode_upstream(frame)


@given(st.binary(max_size=200))
def test_arbitrary_bytes_never_escape_as_other_errors(frame: bytes) -> None:
    """Any byte string either decodes or raises MessageError, in both directions."""
    for decode in (m.decode_upstream, m.decode_downstream):
        with contextlib.suppress(m.MessageError):
            decode(frame)


# The frame from the hardening report: a valid heartbeat with an unknown field nested 10,000 deep.
DEEP_FRAME = '{"op":"heartbeat","x":' + "[" * 10_000 + "]" * 10_000 + "}"


@pytest.mark.parametrize("frame", [DEEP_FRAME, DEEP_FRAME.encode()], ids=["str", "bytes"])
@pytest.mark.parametrize("decode", [m.decode_upstream, m.decode_downstream, m.decode_result])
def test_deeply_nested_frames_are_malformed_naming_the_limit(decode: Any, frame: str | bytes) -> None:
    """A frame nested deeper than the limit is a MessageError naming it, not a RecursionError that ends the hub."""
    with pytest.raises(m.MessageError, match=f"malformed .* frame: nested too deeply: more than {MAX_DEPTH} levels"):
        decode(frame)


def test_unknown_fields_nested_up_to_the_limit_still_decode() -> None:
    """The limit leaves room for a newer peer's nested fields: 64 levels in all decode."""
    inner = MAX_DEPTH - 1  # the frame's own object is the first level
    frame = '{"op":"heartbeat","sentAt":1.0,"x":' + "[" * inner + "]" * inner + "}"
    assert m.decode_upstream(frame) == m.Heartbeat(sent_at=1.0)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)


@given(
    st.sampled_from(["report", "hello", "ack", "heartbeat", "error"]),
    st.dictionaries(
        st.sampled_from(
            ["route", "node", "version", "capabilities", "jobUid", "seq", "action", "succ", "id", "sentAt"]
        ),
        json_values,
    ),
)
def test_message_shaped_objects_with_any_values_never_escape_as_other_errors(
    op: str, fields: dict[str, object]
) -> None:
    """A route (or any field) of any JSON type decodes or is a MessageError, never another exception (which
    would end a hub); that the MessageError names the field is the next test's."""
    frame = json.dumps({"op": op, **fields})
    with contextlib.suppress(m.MessageError):
        m.decode_upstream(frame)


@pytest.mark.parametrize("route", ["5", "[1]", "{}", "null", "true"])
def test_a_route_that_is_not_a_string_is_refused_naming_the_field(route: str) -> None:
    """Once an uncaught NotImplementedError from the route hook that ended the whole hub."""
    frame = '{"op":"report","route":' + route + ',"jobUid":"u","seq":1,"action":"Check","succ":true}'
    with pytest.raises(m.MessageError, match=r"expected a route string, got \w+ - at `\$.route`"):
        m.decode_upstream(frame)


def test_a_hello_with_an_overlong_version_is_malformed() -> None:
    """The version a hub records on the Node is bounded: a 1 MB version is refused at the Hello, naming the field."""
    frame = m.encode(m.Hello(node="edge-1", version="v" * m.MAX_VERSION))
    assert m.decode_upstream(frame) == m.Hello(node="edge-1", version="v" * m.MAX_VERSION)
    with pytest.raises(m.MessageError, match=r"\$\.version"):
        m.decode_upstream(frame.replace(b"v" * m.MAX_VERSION, b"v" * 1_000_000))


def test_node_credentials_messages_are_bounded_where_the_peer_chooses_their_size() -> None:
    """A request's id and PKCS#10 text, an answer's certificate, CA bundle and error each have a limit the
    decoder enforces, naming the field; a request needs an id to be answered."""
    request = {"op": "node_credentials_request", "id": "r1", "csr": "x"}
    assert m.decode_upstream(json.dumps(request)) == m.NodeCredentialsRequest(id="r1", csr="x")
    for field, value in (("csr", "x" * (relay_messages.MAX_CSR_PEM + 1)), ("id", "i" * 65), ("id", "")):
        with pytest.raises(m.MessageError, match=f"\\$.{field}"):
            m.decode_upstream(json.dumps(request | {field: value}))
    answer = {"op": "node_credentials", "id": "r1"}
    for field, limit in (
        ("certificate", relay_messages.MAX_CERTIFICATE_PEM),
        ("caBundle", relay_messages.MAX_CA_BUNDLE_PEM),
        ("error", relay_messages.MAX_CREDENTIALS_ERROR),
    ):
        assert m.decode_downstream(json.dumps(answer | {field: "c" * limit}))
        with pytest.raises(m.MessageError, match=f"\\$.{field}"):
            m.decode_downstream(json.dumps(answer | {field: "c" * (limit + 1)}))


def test_a_node_credentials_answer_from_a_newer_hub_still_decodes() -> None:
    """Fields a later protocol adds to the answer are ignored, as for every message."""
    frame = json.dumps({"op": "node_credentials", "id": "r1", "certificate": "C", "caBundle": "A", "expires": 3})
    assert m.decode_downstream(frame) == m.NodeCredentials(id="r1", certificate="C", ca_bundle="A")
