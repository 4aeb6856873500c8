"""Admission rules of an Operation (its one processor) and an OperationSet (its graph).

Each rule reads the raw JSON spec through a :class:`~schemas.checker.Checker`; :mod:`schemas.diagnosis.validation`
applies them by kind.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from nodetask.names import is_object_name
from schemas.checker import INT32_MAX, Checker, json_type, without_nulls
from schemas.diagnosis import graph as diagnosis_graph
from schemas.diagnosis.v1 import AdjacencyNode
from schemas.processors import BUILTIN_PROCESSORS

__all__ = ["check_operation", "check_operation_set"]

_PROCESSORS: Final = ("httpServer", "scriptRunner", "builtin")
_ONE_PROCESSOR: Final = "must set exactly one of httpServer, scriptRunner, builtin"
_FUNCTION_REFUSED: Final = (
    "the function processor (an image built with Docker on each node) is not supported by nodetaskd; "
    "use httpServer, scriptRunner or builtin"
)


def _check_http(c: Checker, server: Mapping[str, Any], path: str) -> None:
    address = c.typed(server, "address", path, str, "a string")
    if address is not None and not _is_host(address):
        c.fail(f"{path}.address", f"must be an IP address or a DNS name, got {address!r}")
    if server.get("port") is None:
        c.fail(
            f"{path}.port",
            "is required: nodetaskd's agent serves no processors of its own "
            "(what KubeDiag's agent serves on its port are builtin processors here)",
        )
    c.check_range(server, "port", path, 1, 65535)
    url_path = c.typed(server, "path", path, str, "a string")
    if url_path is not None and not url_path.startswith("/"):
        c.fail(f"{path}.path", f"must start with /, got {url_path!r}")
    scheme = c.typed(server, "scheme", path, str, "a string")
    if scheme is not None and scheme not in ("http", "https"):
        c.fail(f"{path}.scheme", f"must be http or https, got {scheme!r}")


def _is_host(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return is_object_name(value)
    return True


def _check_script(c: Checker, runner: Mapping[str, Any], path: str) -> None:
    script = c.typed(runner, "script", path, str, "a string")
    if runner.get("script") is None or script == "":
        c.fail(f"{path}.script", "is required: the script's text")
    keys = c.typed(runner, "argKeys", path, list, "an array of request keys")
    for i, key in enumerate(keys or ()):
        if not isinstance(key, str) or not key:
            c.fail(f"{path}.argKeys[{i}]", f"must be a non-empty request key, got {key!r}")
    result_key = c.typed(runner, "operationResultKey", path, str, "a string")
    if result_key == "":
        c.fail(f"{path}.operationResultKey", "must not be empty when set")


def _check_builtin(c: Checker, builtin: Mapping[str, Any], path: str) -> None:
    name = c.typed(builtin, "name", path, str, "a string")
    if builtin.get("name") is None:
        c.fail(f"{path}.name", f"is required: one of {', '.join(BUILTIN_PROCESSORS)}")
    elif name is not None and name not in BUILTIN_PROCESSORS:
        c.fail(f"{path}.name", f"must be one of {', '.join(BUILTIN_PROCESSORS)}, got {name!r}")


def check_operation(c: Checker, spec: Mapping[str, Any]) -> None:
    path = "spec.processor"
    processor = c.typed(spec, "processor", "spec", dict, "an object")
    if processor is None:
        if spec.get("processor") is None:
            c.fail(path, f"is required and {_ONE_PROCESSOR}")
        return
    if processor.get("function") is not None:
        c.fail(f"{path}.function", _FUNCTION_REFUSED)
    present = [key for key in _PROCESSORS if processor.get(key) is not None]
    if len(present) > 1:
        c.fail(path, f"{_ONE_PROCESSOR}, got {', '.join(present)}")
    elif not present and processor.get("function") is None:
        c.fail(path, f"{_ONE_PROCESSOR}, got none")
    checks = (("httpServer", _check_http), ("scriptRunner", _check_script), ("builtin", _check_builtin))
    for key, check in checks:
        value = c.typed(processor, key, path, dict, "an object")
        if value is not None:
            check(c, value, f"{path}.{key}")
    c.check_range(processor, "timeoutSeconds", path, 1, INT32_MAX)


def check_operation_set(c: Checker, spec: Mapping[str, Any]) -> None:
    path = "spec.adjacencyList"
    nodes = c.typed(spec, "adjacencyList", "spec", list, "an array of graph nodes")
    if nodes is None:
        if spec.get("adjacencyList") is None:
            c.fail(path, "is required: the graph, node 0 first (the start, without an operation)")
        return
    if len(nodes) > diagnosis_graph.MAX_NODES:
        # Said before any node is read: the graph is refused whatever its nodes hold.
        c.fail(path, f"has {len(nodes)} nodes; at most {diagnosis_graph.MAX_NODES} are allowed")
        return
    before = len(c.errors)
    for i, node in enumerate(nodes):
        at = f"{path}[{i}]"
        if not isinstance(node, dict):
            c.fail(at, f"must be an object, got {json_type(node)}")
            continue
        c.typed(node, "id", at, int, "an integer")
        operation = c.typed(node, "operation", at, str, "a string")
        if operation and not is_object_name(operation):
            message = f"must be the name of an Operation (a lowercase DNS subdomain), got {operation!r}"
            c.fail(f"{at}.operation", message)
        for key in ("to", "dependences"):
            for k, target in enumerate(c.typed(node, key, at, list, "an array of node ids") or ()):
                if not isinstance(target, int) or isinstance(target, bool):
                    c.fail(f"{at}.{key}[{k}]", f"must be a node id (an integer), got {json_type(target)}")
    if len(c.errors) > before:
        return  # the graph cannot be read until its fields have the right types
    graph = msgspec.convert(without_nulls(nodes), type=tuple[AdjacencyNode, ...])
    for problem in diagnosis_graph.problems(graph):
        c.fail(problem.path(path), problem.message)
