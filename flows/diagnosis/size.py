"""How large a Diagnosis may grow: every status the controller writes must be one etcd stores.

etcd refuses an object over 1.5 MiB (``--max-request-bytes``); the API server passes that on as a
500, and a controller that writes the same status again is refused again, every 30 s, forever,
while the Diagnosis stays Running. So the run bounds what it writes, knowing what the status can
hold:

- the names of the target nodes, fixed when the run starts (8,000 names of 100 characters take
  800 KiB, and a Diagnosis naming its nodes has them in its spec as well);
- the paths that failed and the one that passed: at most every path of the OperationSet, whose
  size the graph's checks bound (:data:`schemas.diagnosis.graph.MAX_PATHS_BYTES`);
- the checkpoint, one bit per node (:mod:`flows.diagnosis.counted`), and a few conditions;
- the context's results, which the API server records a second time: it notes who set each key of
  ``status.context.operations`` in ``metadata.managedFields``, about as many bytes as the keys.

The size of a Diagnosis is thus counted as its JSON (spec, metadata and status, as this package
encodes them) plus its context's results once more, and kept within :data:`MAX_OBJECT_BYTES`. A run
starts only when its status fits with every path failed and every node counted; the context then
gets what is left (:func:`context_room`), so that it is clipped (:mod:`flows.diagnosis.context`)
before the Diagnosis would be too large; and a status that would not fit all the same ends the run
Failed with ``StatusTooLarge`` (:func:`shrunk` is what that status keeps).
"""

from __future__ import annotations

from typing import Final

import msgspec

from schemas.diagnosis.v1 import Diagnosis, DiagnosisContext, DiagnosisStatus

__all__ = [
    "ETCD_LIMIT",
    "MAX_ANNOTATIONS_BYTES",
    "MAX_OBJECT_BYTES",
    "STATUS_TOO_LARGE",
    "context_room",
    "object_bytes",
    "reserve",
    "shrunk",
    "too_large_message",
]

ETCD_LIMIT: Final = 1536 * 1024
"""etcd's default ``--max-request-bytes``: the most an object may take as stored."""
MAX_OBJECT_BYTES: Final = ETCD_LIMIT - 64 * 1024
"""The most :func:`object_bytes` of a Diagnosis the run writes; the rest of etcd's limit is for what
the API server adds (its own metadata, managedFields of the spec and metadata)."""
MAX_ANNOTATIONS_BYTES: Final = 256 * 1024
"""What the API server allows an object's annotations in all (keys and values)."""
STATUS_TOO_LARGE: Final = "StatusTooLarge"
"""The reason a run ends with when its status would not fit."""
SLACK: Final = 16 * 1024
"""Room kept for the conditions a run may still set (each message is bounded)."""

_ENCODE: Final = msgspec.json.encode


def _operations_bytes(context: DiagnosisContext | None) -> int:
    return len(_ENCODE(context.operations)) if context is not None and context.operations else 0


def object_bytes(diagnosis: Diagnosis) -> int:
    """The Diagnosis as stored: its JSON, and its context's results again (their record in managedFields)."""
    return len(_ENCODE(diagnosis)) + _operations_bytes(diagnosis.status.context)


def _bitmap_bytes(nodes: int) -> int:
    raw = (nodes + 7) // 8
    return 4 * ((raw + 2) // 3) + len('"synchronizedNodes":"",')


def reserve(paths_bytes: int, nodes: int) -> int:
    """What a running status may still grow by, its context apart: every path failed (``paths_bytes``,
    the OperationSet's paths as JSON), every one of ``nodes`` counted, and a few conditions."""
    return paths_bytes + _bitmap_bytes(nodes) + SLACK


def _without_growth(diagnosis: Diagnosis) -> Diagnosis:
    status = diagnosis.status
    context = status.context
    bare = msgspec.structs.replace(
        status,
        failed_paths=(),
        succeeded_path=(),
        context=msgspec.structs.replace(context, operations={}) if context is not None else None,
    )
    return msgspec.structs.replace(diagnosis, status=bare)


def context_room(diagnosis: Diagnosis, *, paths_bytes: int, limit: int) -> int:
    """The bytes of JSON the context's results may take in ``diagnosis`` (negative: not even none fit).

    What :func:`reserve` keeps aside and the rest of the Diagnosis leave of ``limit``, halved: the
    results count twice (:func:`object_bytes`).
    """
    fixed = len(_ENCODE(_without_growth(diagnosis)))
    room = limit - fixed - reserve(paths_bytes, len(diagnosis.status.node_names))
    return room // 2 if room > 0 else room


def too_large_message(diagnosis: Diagnosis, *, size: int, limit: int) -> str:
    """Why ``diagnosis`` (``size`` bytes by :func:`object_bytes`) cannot be written: its largest parts."""
    status = diagnosis.status
    parts = [
        (len(_ENCODE(status.node_names)), f"the names of its {len(status.node_names)} target nodes"),
        (len(_ENCODE(diagnosis.spec)), "its spec"),
        (len(_ENCODE(diagnosis.metadata)), "its metadata"),
        (2 * _operations_bytes(status.context), "the results in its context (counted twice)"),
        (len(_ENCODE(status.failed_paths)) + len(_ENCODE(status.succeeded_path)), "its failed and passed paths"),
    ]
    largest = sorted((p for p in parts if p[0] > 1024), reverse=True)[:3]
    said = "; ".join(f"{what} {count} bytes" for count, what in largest)
    return (
        f"the Diagnosis with its status would take about {size} bytes, more than the {limit} a Diagnosis may"
        f" (etcd stores at most {ETCD_LIMIT} bytes an object){': ' if said else ''}{said}"
    )


def shrunk(status: DiagnosisStatus) -> DiagnosisStatus:
    """What a run's status keeps when it ends too large: no node names, no results, no counted nodes.

    The target nodes stay in the spec (or its selectors), and each Task keeps its own results.
    """
    context = status.context
    checkpoint = status.checkpoint
    return msgspec.structs.replace(
        status,
        node_names=(),
        context=msgspec.structs.replace(context, operations={}) if context is not None else None,
        checkpoint=(
            msgspec.structs.replace(checkpoint, synchronized_nodes=msgspec.UNSET, synchronized_tasks=msgspec.UNSET)
            if checkpoint is not None
            else None
        ),
    )
