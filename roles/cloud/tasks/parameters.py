"""The parameters of the Diagnoses whose Tasks a hub sends, read from the API server once each.

A Task does not carry its Diagnosis's parameters (:mod:`flows.diagnosis.tasks`): copied into every
Task they were that many copies in etcd and in the memory of the controller and of every hub. The
hub reads them when it sends a Task instead, from the Diagnosis its ownerReference names, decoding
nothing else of it (its status may be large). A stage sends a Task to each of its nodes at once, so
the reads of one Diagnosis are shared: the first asks the API server and the others wait for that
answer. A Diagnosis's spec is immutable (the webhook refuses changes to it, and a run resumes over
the same parameters), so what was read is kept by uid, for the :data:`KEPT` Diagnoses used last.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import anyio
import structlog

from roles.cloud.api import ObjectReader
from roles.kube.resources import DIAGNOSIS_PARAMETERS
from roles.kube.retrying import read_through_outage

__all__ = ["KEPT", "ParameterReader"]

Log = structlog.typing.FilteringBoundLogger

KEPT: Final = 64
"""Diagnoses whose parameters are kept (at most 64 KiB each, as the webhook admits them)."""


class ParameterReader:
    """Reads and keeps Diagnoses' parameters; share one per hub."""

    def __init__(self, api: ObjectReader, *, log: Log, kept: int = KEPT) -> None:
        self._api = api
        self._log = log
        self._limit = kept
        self._kept: OrderedDict[str, Mapping[str, str] | None] = OrderedDict()
        self._reading: dict[str, anyio.Event] = {}
        self.reads = 0
        """Reads sent to the API server (a metric, and what tests count)."""

    async def parameters(self, *, namespace: str, name: str, uid: str) -> Mapping[str, str] | None:
        """The parameters of the Diagnosis ``namespace/name`` whose uid is ``uid``; None if there is no such
        Diagnosis (deleted, or another one of that name since).

        Errors: none; an API error is retried with backoff until the read succeeds. Cancellation: a
        cancelled read leaves the next caller to read again.
        """
        while uid not in self._kept:
            reading = self._reading.get(uid)
            if reading is None:
                await self._read(namespace, name, uid)
            else:
                await reading.wait()  # read by another caller (or given up: then this one reads)
        self._kept.move_to_end(uid)
        return self._kept[uid]

    async def _read(self, namespace: str, name: str, uid: str) -> None:
        done = self._reading[uid] = anyio.Event()
        try:
            found = await self._get(namespace, name, uid)
            self._kept[uid] = found
            while len(self._kept) > self._limit:
                self._kept.popitem(last=False)
        finally:
            del self._reading[uid]
            done.set()

    async def _get(self, namespace: str, name: str, uid: str) -> Mapping[str, str] | None:
        self.reads += 1
        log = self._log.bind(diagnosis=f"{namespace}/{name}")
        diagnosis = await read_through_outage(
            self._api, DIAGNOSIS_PARAMETERS, name, namespace=namespace, log=log, event="diagnosis_read_retry"
        )
        if diagnosis is None or diagnosis.metadata.uid != uid:
            return None
        return MappingProxyType(dict(diagnosis.spec.parameters))
