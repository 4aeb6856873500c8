"""The agent's metrics page: what each count it read becomes in Prometheus' text format."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from roles.common.edge_config import EdgeConfig, LocalApiConfig, MetricsConfig, NodeApiConfig
from roles.edge.metrics import render
from roles.edge.observed import Observed
from tests.metric_samples import Samples, samples

SEEN = Observed(
    tasks={"running": 2, "finished": 5},
    outbox_depth=3,
    reports_dropped=1,
    store_bytes=4096,
    store_problem="",
    connected=True,
    sessions=4,
    error_keys=2,
    ledger_persisted=True,
    autonomy_requested=True,
    autonomy_condition="False",
)


def _samples(observed: Observed) -> Samples:
    return samples(render(observed).decode())


def test_every_count_the_agent_read_is_a_sample_named_for_it() -> None:
    """Tasks by state (0 for a state with none), outbox, store, hub session, cache and autonomy samples."""
    samples = _samples(SEEN)
    assert samples[("nodetaskd_edge_tasks", (("state", "running"),))] == 2
    assert samples[("nodetaskd_edge_tasks", (("state", "waiting_confirmation"),))] == 0
    assert samples[("nodetaskd_edge_tasks", (("state", "finished"),))] == 5
    assert samples[("nodetaskd_edge_outbox_depth", ())] == 3
    assert samples[("nodetaskd_edge_reports_dropped", ())] == 1
    assert samples[("nodetaskd_edge_store_bytes", ())] == 4096
    assert samples[("nodetaskd_edge_store_ok", ())] == 1
    assert samples[("nodetaskd_edge_hub_connected", ())] == 1
    assert samples[("nodetaskd_edge_hub_sessions_total", ())] == 4
    assert samples[("nodetaskd_edge_cache_error_keys", ())] == 2
    assert samples[("nodetaskd_edge_cache_ledger_persisted", ())] == 1
    assert samples[("nodetaskd_edge_autonomy_requested", ())] == 1
    conditions = {
        labels[0][1]: v for (name, labels), v in samples.items() if name == "nodetaskd_edge_autonomy_condition"
    }
    assert conditions == {"True": 0, "False": 1, "Unknown": 0}


@given(condition=st.sampled_from(["", "True", "False", "Unknown"]), problem=st.sampled_from(["", "disk I/O error"]))
def test_at_most_one_condition_is_on_and_a_store_that_cannot_be_read_says_so(condition: str, problem: str) -> None:
    """Before the first check no condition is on; a store error turns store_ok off."""
    samples = _samples(msgspec.structs.replace(SEEN, autonomy_condition=condition, store_problem=problem))
    on = [dict(labels)["status"] for (name, labels), v in samples.items() if name.endswith("condition") and v]
    assert on == ([condition] if condition else [])
    assert samples[("nodetaskd_edge_store_ok", ())] == (0 if problem else 1)


def test_the_metrics_port_is_one_of_the_agents_own_and_may_not_be_another_listeners() -> None:
    """Its port counts among the agent's ports once on, and sharing one with the node API is refused naming both."""
    on = MetricsConfig(enabled=True, port=10263)
    assert EdgeConfig(metrics=on).served_ports == (10263,)
    assert EdgeConfig(metrics=MetricsConfig(port=10263)).served_ports == ()
    assert EdgeConfig(metrics=on, local_api=LocalApiConfig(enabled=True)).served_ports == (10261, 10263)
    with pytest.raises(ValueError, match=r"nodeApi.port and metrics.port are both 10263: give each its own"):
        EdgeConfig(metrics=on, node_api=NodeApiConfig(enabled=True, port=10263))


def test_an_idle_agent_loads_neither_its_metrics_nor_the_kubelets_jobs() -> None:
    """Starting the edge role imports no Prometheus client and no kubelet step: each waits until it is used."""
    heavy = ["prometheus_client", "roles.edge.metrics", "roles.edge.kubelet.upgrade", "roles.edge.kubelet.config"]
    code = f"import sys, roles.edge.role; print([m for m in {heavy!r} if m in sys.modules])"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"
