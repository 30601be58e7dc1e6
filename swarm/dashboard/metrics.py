"""`/metrics`: the dashboard's snapshot in Prometheus' text format (prometheus-client).

Per peer (labels `peer`, `stage`), for peers that are online:

    swarm_peer_tokens_per_second   swarm_peer_loss (head/tail only)   swarm_peer_step
    swarm_peer_bytes_in_per_second swarm_peer_bytes_out_per_second    swarm_peer_basis_version
    swarm_peer_sync_bytes_per_step (replicas: reduce bytes sent per step taken with other replicas)

For the swarm: swarm_stages, swarm_stages_covered, swarm_peers (online), swarm_invalid_records
(distinct malformed, forged or misfiled health records seen), swarm_forward_bytes_per_token and
swarm_compression_ratio (dense bytes per token / forward bytes per token), swarm_sync_bytes_per_step
(the busiest replica's).

Values are read from the latest snapshot at scrape time by a collector that belongs to one
registry per dashboard (no process-global registry).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PEER_GAUGES = (  # (metric name, snapshot field, help)
    ("swarm_peer_tokens_per_second", "tokens_per_s", "Tokens this peer passed on per second."),
    ("swarm_peer_loss", "loss", "Training loss reported by a head or tail peer."),
    ("swarm_peer_step", "step", "Optimizer steps this peer's stage has done."),
    ("swarm_peer_bytes_in_per_second", "bytes_in_per_s", "Bytes per second this peer received on the wire."),
    ("swarm_peer_bytes_out_per_second", "bytes_out_per_s", "Bytes per second this peer sent on the wire."),
    ("swarm_peer_basis_version", "basis_version", "Version of the shared subspace basis this peer uses."),
    ("swarm_peer_sync_bytes_per_step", "sync_bytes_per_step",
     "Replica-sync bytes this peer sent per step it took with other replicas of its stage."),
)


class SnapshotCollector(Collector):
    def __init__(self, snapshot: Callable[[], dict]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        online = [p for p in snap["peers"] if p["online"]]
        for name, field, doc in PEER_GAUGES:
            gauge = GaugeMetricFamily(name, doc, labels=["peer", "stage"])
            for p in online:
                if p.get(field) is not None:
                    gauge.add_metric([p["peer_id"], str(p["stage"])], float(p[field]))
            yield gauge
        wire = snap["wire"] or {}
        for name, value, doc in (
            ("swarm_stages", len(snap["stages"]), "Pipeline stages of the run."),
            ("swarm_stages_covered", sum(s["covered"] for s in snap["stages"]), "Stages with an online peer."),
            ("swarm_peers", len(online), "Online peers."),
            ("swarm_invalid_records", snap["invalid_records"], "Distinct invalid health records seen (ignored)."),
            ("swarm_forward_bytes_per_token", wire.get("forward_bytes_per_token"), "Forward wire bytes per token."),
            ("swarm_compression_ratio", wire.get("compression_ratio"),
             "Dense bytes per token / forward bytes per token."),
            ("swarm_sync_bytes_per_step", wire.get("sync_bytes_per_step"),
             "Replica-sync bytes per step of the busiest replica."),
        ):
            gauge = GaugeMetricFamily(name, doc)
            if value is not None:
                gauge.add_metric([], float(value))
            yield gauge


def make_registry(snapshot: Callable[[], dict]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
