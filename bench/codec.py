"""Benchmark 3: the wire codec (msgspec, :mod:`nodetask.messages`) against the standard library's json.

The same frames both ways. The json side is made fair: it decodes into dicts, dispatches on
``op``, checks the type of every field msgspec checks (required ones present, ``seq`` an integer
and not a bool, optional strings defaulted), and parses the route with the same function as the
decoder (:func:`nodetask.messages.parse_route`, memoised, so a route seen before costs a lookup);
it encodes a dict with the route's string form, compactly. Route parsing and formatting are the
same code on both sides, so they are reported once, without a ratio. One more row decodes reports
whose route is new to both sides (plain :meth:`Route.parse`): a node task's first report.

Rates are medians over ``repeats`` rounds; each round times both codecs back to back, and the
ratio is the median of the per-round ratios.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from flows.nodejobs import imageprepulljob
from nodetask import messages
from nodetask.messages import Heartbeat, Report
from nodetask.phases import ConditionStatus
from nodetask.route import Route
from schemas.v1alpha2 import API_VERSION, ImageStatus

ROUTE = Route(API_VERSION, "imageprepulljob", "prepull-web-2026-11", "edge-node-004217")
ROUTE_TEXT = str(ROUTE)
REPORT = Report(
    route=ROUTE,
    job_uid="0b7c8f0e-6f1c-4c55-9a51-6d2f3f1e8a42",
    seq=17,
    action=imageprepulljob.PULL,
    succ=True,
    finish_time="2026-11-26T02:03:55Z",
    extend=imageprepulljob.encode_extend(
        (
            ImageStatus(image="registry.local/app:1", status=ConditionStatus.TRUE),
            ImageStatus(image="registry.local/db:2", status=ConditionStatus.TRUE),
        )
    ),
)
HEARTBEAT = Heartbeat(sent_at=12345.678)


# ----------------------------------------------------------------------------------- the json side


class JsonMessageError(ValueError):
    pass


def _str(d: dict[str, Any], key: str, *, required: bool = True) -> str:
    value = d.get(key)
    if value is None:
        if required:
            raise JsonMessageError(f"missing {key}")
        return ""
    if not isinstance(value, str):
        raise JsonMessageError(f"{key} must be a string")
    return value


def _report(d: dict[str, Any], parse: Callable[[str], Route] = messages.parse_route) -> dict[str, Any]:
    seq = d.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise JsonMessageError("seq must be an integer")
    succ = d.get("succ")
    if not isinstance(succ, bool):
        raise JsonMessageError("succ must be a boolean")
    return {
        "op": "report",
        "route": parse(_str(d, "route")),
        "jobUid": _str(d, "jobUid"),
        "seq": seq,
        "action": _str(d, "action"),
        "succ": succ,
        "finishTime": _str(d, "finishTime", required=False),
        "reason": _str(d, "reason", required=False),
        "extend": _str(d, "extend", required=False),
    }


def _heartbeat(d: dict[str, Any]) -> dict[str, Any]:
    sent_at = d.get("sentAt", 0.0)
    if not isinstance(sent_at, (int, float)) or isinstance(sent_at, bool):
        raise JsonMessageError("sentAt must be a number")
    return {"op": "heartbeat", "sentAt": float(sent_at)}


_JSON_UPSTREAM: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "report": _report,
    "heartbeat": _heartbeat,
}


def json_decode_upstream(frame: bytes) -> dict[str, Any]:
    d = json.loads(frame)
    if not isinstance(d, dict):
        raise JsonMessageError("a frame is an object")
    decode = _JSON_UPSTREAM.get(d.get("op", ""))
    if decode is None:
        raise JsonMessageError("unknown op")
    return decode(d)


def json_encode(msg: dict[str, Any]) -> bytes:
    out = dict(msg)
    if isinstance(out.get("route"), Route):
        out["route"] = str(out["route"])
    return json.dumps(out, separators=(",", ":")).encode()


# ----------------------------------------------------------------------------------------- timing


@dataclass(frozen=True, slots=True)
class CodecRow:
    operation: str
    msgspec_per_s: float
    json_per_s: float | None
    ratio: float | None
    frame_bytes: int


def _rate(fn: Callable[[], object], iterations: int) -> float:
    started = time.perf_counter()
    for _ in range(iterations):
        fn()
    return iterations / (time.perf_counter() - started)


def _pair(
    name: str,
    fast: Callable[[], object],
    slow: Callable[[], object] | None,
    *,
    frame_bytes: int,
    iterations: int,
    repeats: int,
) -> CodecRow:
    fast_rates: list[float] = []
    slow_rates: list[float] = []
    for _ in range(repeats):
        fast_rates.append(_rate(fast, iterations))
        if slow is not None:
            slow_rates.append(_rate(slow, iterations))
    if slow is None:
        return CodecRow(name, statistics.median(fast_rates), None, None, frame_bytes)
    ratios = [f / s for f, s in zip(fast_rates, slow_rates, strict=True)]
    return CodecRow(
        name, statistics.median(fast_rates), statistics.median(slow_rates), statistics.median(ratios), frame_bytes
    )


def check_equivalence() -> None:
    """Both codecs read the same frames into the same values (a guard against an unfair comparison)."""
    for msg in (REPORT, HEARTBEAT):
        frame = messages.encode(msg)
        ours = messages.decode_upstream(frame)
        theirs = json_decode_upstream(frame)
        assert ours == msg, ours
        for key, value in theirs.items():
            if key != "op":
                assert getattr(ours, _snake(key)) == value, (key, value)
        assert messages.decode_upstream(json_encode(theirs)) == msg


def _snake(camel: str) -> str:
    return "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)


def run(*, iterations: int = 50_000, repeats: int = 5) -> list[CodecRow]:
    """Messages per second for each operation, msgspec against json."""
    check_equivalence()
    report_frame = messages.encode(REPORT)
    heartbeat_frame = messages.encode(HEARTBEAT)
    report_dict = json_decode_upstream(report_frame)
    heartbeat_dict = json_decode_upstream(heartbeat_frame)
    fast_only: list[tuple[str, Callable[[], object]]] = [
        ("route parse (new route)", lambda: Route.parse(ROUTE_TEXT)),
        ("route parse (seen before)", lambda: messages.parse_route(ROUTE_TEXT)),
        ("route format", lambda: str(ROUTE)),
    ]
    paired: list[tuple[str, Callable[[], object], Callable[[], object], bytes]] = [
        ("report decode", lambda: messages.decode_upstream(report_frame),
         lambda: json_decode_upstream(report_frame), report_frame),
        ("report decode (new route)", lambda: _UNCACHED_UPSTREAM.decode(report_frame),
         lambda: _json_decode_uncached(report_frame), report_frame),
        ("report encode", lambda: messages.encode(REPORT), lambda: json_encode(report_dict), report_frame),
        ("heartbeat decode", lambda: messages.decode_upstream(heartbeat_frame),
         lambda: json_decode_upstream(heartbeat_frame), heartbeat_frame),
        ("heartbeat encode", lambda: messages.encode(HEARTBEAT), lambda: json_encode(heartbeat_dict), heartbeat_frame),
    ]  # fmt: skip
    rows = [
        _pair(name, fast, None, frame_bytes=len(ROUTE_TEXT), iterations=iterations, repeats=repeats)
        for name, fast in fast_only
    ]
    rows += [
        _pair(name, fast, slow, frame_bytes=len(frame), iterations=iterations, repeats=repeats)
        for name, fast, slow, frame in paired
    ]
    return rows


def route_share(*, iterations: int = 50_000) -> float:
    """The share of a report's decode spent parsing a route it has not seen before."""
    frame = messages.encode(REPORT)
    decode = _rate(lambda: _UNCACHED_UPSTREAM.decode(frame), iterations)
    parse = _rate(lambda: Route.parse(ROUTE_TEXT), iterations)
    return (1 / parse) / (1 / decode)


# ------------------------------------------------------------------------- a route neither side has seen


def _uncached_hook(tp: type, obj: Any) -> Any:
    if tp is Route and isinstance(obj, str):
        return Route.parse(obj)
    raise NotImplementedError(f"cannot decode {tp!r}")


_UNCACHED_UPSTREAM = msgspec.json.Decoder(messages.Upstream, dec_hook=_uncached_hook)


def _json_decode_uncached(frame: bytes) -> dict[str, Any]:
    d = json.loads(frame)
    if not isinstance(d, dict) or d.get("op") != "report":
        raise JsonMessageError("expected a report")
    return _report(d, Route.parse)
