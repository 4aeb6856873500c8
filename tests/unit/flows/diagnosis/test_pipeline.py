"""An OperationSet's status: ready with its paths, or a condition naming the bad node; its graph's hash."""

from __future__ import annotations

from datetime import timedelta

import msgspec

from flows.diagnosis.pipeline import BrokenGraph, adjacency_hash, operation_set_status, pipeline_of
from schemas.diagnosis.v1 import AdjacencyNode
from tests.unit.flows.diagnosis.world import T0, operation_set

KUBEDIAG_GRAPH = [[1, 2, 3], [4, 5], [5], [6], [7, 8], [3, 6, 7], [8], [], []]


def test_a_valid_graph_is_ready_with_every_path() -> None:
    """KubeDiag's graph-builder vector: nine paths, ready, and a Ready condition counting them."""
    digest, status = operation_set_status(operation_set(KUBEDIAG_GRAPH), now=T0)
    assert status.ready
    assert len(status.paths) == 9
    assert [n.id for n in status.paths[0]] == [1, 4, 7]
    (ready,) = status.conditions
    assert (ready.type, ready.status, ready.reason) == ("Ready", "True", "PathsFound")
    assert ready.message == "9 paths from the start node to a last node"
    assert digest == adjacency_hash(operation_set(KUBEDIAG_GRAPH).spec.adjacency_list)


def test_a_bad_graph_is_not_ready_and_names_each_bad_node() -> None:
    """No paths, not ready, and the condition names every problem at its field (no silent retrying)."""
    _, status = operation_set_status(operation_set([[1], [], [1]]), now=T0)
    assert (status.ready, status.paths) == (False, ())
    (ready,) = status.conditions
    assert (ready.status, ready.reason) == ("False", "InvalidGraph")
    assert ready.message == "spec.adjacencyList[2]: node 2 (op-2) is not reachable from the start node 0"


def test_an_unchanged_operation_set_gets_the_status_it_has() -> None:
    """Deciding again later keeps the condition's transition time, so nothing is written again."""
    opset = operation_set(KUBEDIAG_GRAPH)
    _, status = operation_set_status(opset, now=T0)
    written = msgspec.structs.replace(opset, status=status)
    assert operation_set_status(written, now=T0 + timedelta(hours=1))[1] == status


def test_the_hash_follows_operations_and_edges_only() -> None:
    """Another operation or edge is another hash; ids and KubeDiag's unused dependences are not."""
    nodes = operation_set([[1], [2], []]).spec.adjacency_list
    digest = adjacency_hash(nodes)
    assert len(digest) == 16
    annotated = tuple(msgspec.structs.replace(n, id=i, dependences=(0,) if i else ()) for i, n in enumerate(nodes))
    assert adjacency_hash(annotated) == digest
    renamed = (*nodes[:2], AdjacencyNode(operation="other"))
    assert adjacency_hash(renamed) != digest
    assert adjacency_hash(operation_set([[1, 2], [], []]).spec.adjacency_list) != adjacency_hash(
        operation_set([[2, 1], [], []]).spec.adjacency_list
    )


def test_a_one_node_graph_cannot_run() -> None:
    """KubeDiag's single-node vector has no path: here that is a graph no Diagnosis can run."""
    assert isinstance(pipeline_of(operation_set([[]])), BrokenGraph)
