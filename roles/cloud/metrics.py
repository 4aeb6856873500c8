"""The cloud hub's Prometheus metrics, registered in a registry the role owns."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class _KubeCounters(Collector):
    """Reads the API client's write and conflict counters at scrape time."""

    def __init__(self, read: Callable[[], tuple[int, int]]) -> None:
        self._read = read

    def collect(self) -> Iterator[CounterMetricFamily]:
        writes, conflicts = self._read()
        yield CounterMetricFamily("nodetaskd_hub_api_writes", "Writes to the API server.", value=writes)
        yield CounterMetricFamily(
            "nodetaskd_hub_api_conflicts", "409 conflicts met by status writes (each retried).", value=conflicts
        )


class _FrameCounts(Collector):
    """Frames by op in each direction, as plain integers read at scrape time.

    Counted for every frame, so on the hub's hottest path: a labelled prometheus Counter takes a lock
    per increment (about 4% of a heartbeat echo's CPU), a dict entry does not.
    """

    def __init__(self, received: dict[str, int], sent: dict[str, int]) -> None:
        self._received = received
        self._sent = sent

    def collect(self) -> Iterator[CounterMetricFamily]:
        for name, doc, counts in (
            ("nodetaskd_hub_messages_in", "Frames received from edges, by op.", self._received),
            ("nodetaskd_hub_messages_out", "Frames sent to edges, by op.", self._sent),
        ):
            family = CounterMetricFamily(name, doc, labels=["op"])
            for op, count in list(counts.items()):
                family.add_metric([op], count)
            yield family


class _TunnelBytes(Collector):
    """Bytes relayed through tunnels, by direction, read at scrape time (counted per data frame)."""

    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "nodetaskd_hub_tunnel_bytes", "Bytes relayed between devices and the API server.", labels=["direction"]
        )
        for direction, count in list(self._counts.items()):
            family.add_metric([direction], count)
        yield family


class HubMetrics:
    """Counters, gauges and histograms of one hub."""

    def __init__(
        self, registry: CollectorRegistry, *, sessions: Callable[[], int], kube: Callable[[], tuple[int, int]]
    ) -> None:
        self.connected = Gauge("nodetaskd_hub_connected_edges", "Edge sessions held.", registry=registry)
        self.connected.set_function(sessions)
        self.frames_in: dict[str, int] = {}
        """Frames received, by op: add to them directly (see :class:`_FrameCounts`)."""
        self.frames_out: dict[str, int] = {}
        """Frames sent, by op."""
        registry.register(_FrameCounts(self.frames_in, self.frames_out))
        self.tunnels = Gauge(
            "nodetaskd_hub_tunnels", "Devices' tunnels to the API server open through this hub.", registry=registry
        )
        self.tunnels_opened = Counter(
            "nodetaskd_hub_tunnels_opened",
            "Tunnels devices asked for, by outcome (opened, refused, unreachable, hub_full: out of descriptors).",
            ["outcome"],
            registry=registry,
        )
        self.node_certificates = Counter(
            "nodetaskd_hub_node_certificates",
            "Devices' requests for their node's certificate, by outcome (issued, refused, busy).",
            ["outcome"],
            registry=registry,
        )
        self.tunnel_bytes: dict[str, int] = {"up": 0, "down": 0}
        """Bytes relayed, to the API server (up) and to devices (down): add to them directly."""
        registry.register(_TunnelBytes(self.tunnel_bytes))
        self.rejected = Counter(
            "nodetaskd_hub_rejected_frames", "Frames refused, by reason.", ["reason"], registry=registry
        )
        self.auth_failures = Counter(
            "nodetaskd_hub_auth_failures", "Handshakes refused, by HTTP status.", ["status"], registry=registry
        )
        self.dispatch_latency = Histogram(
            "nodetaskd_hub_dispatch_latency_seconds",
            "From a node task's claim being written to its RunAction being sent.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ack_latency = Histogram(
            "nodetaskd_hub_ack_latency_seconds",
            "From a RunAction being sent to the edge acknowledging it.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.report_latency = Histogram(
            "nodetaskd_hub_report_latency_seconds",
            "From a report arriving to its status write succeeding (coalescing window included).",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.status_batches = Counter(
            "nodetaskd_hub_status_writes", "Coalesced job status writes that succeeded.", registry=registry
        )
        self.status_failures = Counter(
            "nodetaskd_hub_status_write_failures",
            "Coalesced job status writes that failed (too_large: refused for the object's size; retried).",
            ["too_large"],
            registry=registry,
        )
        self.token_reads = Counter(
            "nodetaskd_hub_token_reads",
            "Token Secrets read one by one (GET); labelled token Secrets are watched instead.",
            registry=registry,
        )
        self.connection_errors = Counter(
            "nodetaskd_hub_connection_errors",
            "Connections ended by an unexpected error in the hub (logged with its traceback), by transport.",
            ["transport"],
            registry=registry,
        )
        self.connections_refused = Counter(
            "nodetaskd_hub_connections_refused",
            "Connections refused at a limit, by the setting that sets it.",
            ["limit"],
            registry=registry,
        )
        self.handshake_timeouts = Counter(
            "nodetaskd_hub_handshake_timeouts",
            "Edge connections closed for not completing their TLS and websocket handshake in time.",
            registry=registry,
        )
        self.handshakes = Gauge(
            "nodetaskd_hub_handshakes", "Edge connections not yet past their token check.", registry=registry
        )
        self.marks_pending = Gauge(
            "nodetaskd_hub_node_marks_pending",
            "Node marks (hub and agent-version annotations) waiting for their turn or their answer.",
            registry=registry,
        )
        self.mark_oldest = Gauge(
            "nodetaskd_hub_node_mark_oldest_seconds",
            "How long the oldest pending Node mark has waited (0 when none is pending).",
            registry=registry,
        )
        self.node_marks = Counter(
            "nodetaskd_hub_node_marks",
            "Node marks settled, by outcome: written, skipped (the Node said this hub and agent version"
            " already) or failed.",
            ["outcome"],
            registry=registry,
        )
        self.cache_sessions = Gauge(
            "nodetaskd_hub_cache_sessions",
            "Sessions fed cache streams (their edges listed cache.v1).",
            registry=registry,
        )
        self.cache_objects = Gauge(
            "nodetaskd_hub_cache_objects",
            "Referenced ConfigMaps and Secrets the hub holds for its cache sessions, by kind.",
            ["kind"],
            registry=registry,
        )
        self.cache_watches_listed = Gauge(
            "nodetaskd_hub_cache_watches_listed",
            "Shared cache watches (one per cached kind) that have listed their kind at least once.",
            registry=registry,
        )
        self.cache_relists = Counter(
            "nodetaskd_hub_cache_relists",
            "Cache sessions relisted because their edge fell behind (its queue was full).",
            registry=registry,
        )
        self.cache_list_failures = Counter(
            "nodetaskd_hub_cache_list_failures",
            "Lists for cache streams that failed (retried with backoff), by kind.",
            ["kind"],
            registry=registry,
        )
        self.autonomy_conditions = Counter(
            "nodetaskd_hub_autonomy_condition_writes",
            "Autonomy conditions written on Nodes, by status.",
            ["status"],
            registry=registry,
        )
        registry.register(_KubeCounters(kube))
