"""KubeDiag's processors: what an Operation runs on a node, and all of a diagnosis Task a device reads.

Apart from :mod:`schemas.diagnosis.v1` (which re-exports them) because an edge agent decodes a Task's
processor and nothing else of the diagnosis API: it loads these types, not the Diagnosis,
OperationSet and Task objects, which a device never sees.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from schemas.meta import ApiStruct

__all__ = [
    "BUILTIN_PROCESSORS",
    "DEFAULT_TIMEOUT_SECONDS",
    "Builtin",
    "Function",
    "HTTPServer",
    "Port",
    "Processor",
    "ScriptRunner",
    "TimeoutSeconds",
]

DEFAULT_TIMEOUT_SECONDS: Final = 30
"""KubeDiag's default for ``spec.processor.timeoutSeconds``."""

BUILTIN_PROCESSORS: Final = (
    "node.resources",
    "node.processes",
    "containers.list",
    "images.list",
    "network.probe",
    "file.tail",
    "agent.status",
)
"""The in-process collectors a ``builtin`` processor may name."""

Port = Annotated[int, msgspec.Meta(ge=1, le=65535, extra_json_schema={"format": "int32"})]
TimeoutSeconds = Annotated[int, msgspec.Meta(ge=1, le=2**31 - 1, extra_json_schema={"format": "int32"})]


class HTTPServer(ApiStruct, frozen=True):
    """POST the request data to ``scheme://address:port/path``; absent address: the device itself."""

    address: str | None = None
    port: Port | None = None
    path: str = "/"
    scheme: str = "http"


class ScriptRunner(ApiStruct, frozen=True):
    """Run ``script`` with the values of ``argKeys`` as its arguments."""

    script: str
    arg_keys: tuple[str, ...] = ()
    operation_result_key: str | None = None


class Builtin(ApiStruct, frozen=True):
    """One of nodetaskd's in-process collectors."""

    name: str


class Function(ApiStruct, frozen=True):
    """KubeDiag's function processor: decoded only to be refused by validation."""

    code_source: dict[str, str] = {}
    runtime: str = ""


class Processor(ApiStruct, frozen=True):
    """Exactly one of httpServer, scriptRunner and builtin, and how long one run may take."""

    http_server: HTTPServer | None = None
    script_runner: ScriptRunner | None = None
    builtin: Builtin | None = None
    function: Function | None = None
    timeout_seconds: TimeoutSeconds = DEFAULT_TIMEOUT_SECONDS
