"""The light edge (the benchmarks' double) runs diagnosis Tasks: a fixed results map, and what its request carried."""

from __future__ import annotations

import msgspec

from flows.diagnosis import job as diagnosis_job
from flows.diagnosis.hub_task import route_of, task_run
from flows.diagnosis.job import RUN, decode_results
from nodetask.messages import RunAction
from roles.common.jobtypes import edge_job_types
from schemas.diagnosis.v1 import Task, TaskSpec
from schemas.meta import ObjectMeta
from schemas.processors import Builtin, Processor
from tools.doubles.lightedge import LightEdge


def _run_action(parameters: dict[str, str]) -> RunAction:
    task = Task(
        metadata=ObjectMeta(name="d.0123abcd.bench-00001.0.1.second", namespace="ns", uid="uid-1"),
        spec=TaskSpec(operation="second", node_name="bench-00001", parameters=parameters),
    )
    spec = task_run(task, Processor(builtin=Builtin(name="agent.status")))
    return RunAction(id="uid-1/1", route=route_of(task), job_uid="uid-1", action=RUN, spec=msgspec.Raw(spec))


def test_a_light_edge_reports_a_fixed_results_map_counting_the_results_passed_to_it() -> None:
    """A Task's Run succeeds with the node, the Operation and the counts of request keys and of keys that an
    earlier stage's light edge reported, as a JSON object of strings the hub accepts."""
    edge = LightEdge(node="bench-00001", url="ws://127.0.0.1:1", token="t", job_types=edge_job_types())
    run = _run_action({"first.lightedge.node": "bench-00001", "first.lightedge.operation": "first", "p": "1"})
    extend = edge._extend(edge.job_types[diagnosis_job.RESOURCE_TYPE], run, RUN, True)
    assert decode_results(extend) == {
        "lightedge.node": "bench-00001",
        "lightedge.operation": "second",
        "lightedge.requestKeys": "4",  # the three parameters and the task.uid the hub adds
        "lightedge.propagatedKeys": "2",
    }
