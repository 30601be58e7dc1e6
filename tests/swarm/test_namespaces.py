"""Kernel link shaping: namespaces that reach each other through tbf-shaped veths, removed afterwards
(also on error), a clear refusal where it is not allowed, and a real local swarm placed in them.
Skipped, with the reason, on machines without root or `ip netns`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from protocol.spec import preset
from swarm.bench.record.throughput import _one_run, kernel_shaping_problem
from swarm.net import namespaces
from swarm.net.namespaces import KernelLinks, KernelShapingUnavailable

PROBLEM = kernel_shaping_problem()
needs_netns = pytest.mark.skipif(PROBLEM is not None, reason=f"kernel shaping unavailable: {PROBLEM}")


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 5001))
print("listening", flush=True)
conn, _ = s.accept()
n = 0
while chunk := conn.recv(65536):
    n += len(chunk)
print(n, flush=True)
"""

CLIENT = """
import socket, sys
c = socket.create_connection((sys.argv[1], 5001), timeout=20)
c.sendall(b"x" * int(sys.argv[2]))
c.close()
"""


@pytest.mark.e2e
@needs_netns
def test_namespaces_reach_each_other_through_shaped_links_and_are_removed():
    with KernelLinks(["a", "b"], "8mbit") as links:
        made = {links.namespace("a"), links.namespace("b"), links.hub}
        assert made <= _namespaces()
        qdisc = json.loads(subprocess.run(["tc", "-n", links.namespace("a"), "-j", "qdisc", "show", "dev", "eth0"],
                                          capture_output=True, text=True, check=True).stdout)
        assert qdisc[0]["kind"] == "tbf" and qdisc[0]["options"]["rate"] == 1_000_000  # bytes/s
        server = subprocess.Popen(links.prefix("b") + [sys.executable, "-c", SERVER, links.host("b")],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert server.stdout.readline().strip() == "listening"
            subprocess.run(links.prefix("a") + [sys.executable, "-c", CLIENT, links.host("b"), "200000"],
                           check=True, timeout=30)
            assert int(server.stdout.readline()) == 200_000
        finally:
            server.kill()
            server.wait()
        stats = links.stats()
        assert stats["a"]["uplink_bytes"] > 200_000  # the payload, plus TCP/IP headers
        assert stats["b"]["downlink_bytes"] > 200_000
        assert stats["a"]["uplink_busy_s"] == pytest.approx(stats["a"]["uplink_bytes"] * 8 / 8e6)
        assert stats["b"]["uplink_bytes"] < 50_000  # only acknowledgements went back
    assert not made & _namespaces()


@pytest.mark.e2e
@needs_netns
def test_namespaces_are_removed_when_the_run_fails():
    links = KernelLinks(["coordinator"], "80mbit")
    with pytest.raises(RuntimeError, match="boom"):
        with links:
            assert links.namespace("coordinator") in _namespaces()
            raise RuntimeError("boom")
    assert not {links.namespace("coordinator"), links.hub} & _namespaces()


def test_without_root_kernel_shaping_says_why(monkeypatch):
    monkeypatch.setattr(namespaces.os, "geteuid", lambda: 1000)
    with pytest.raises(KernelShapingUnavailable, match="kernel shaping needs root"):
        KernelLinks(["coordinator"], "8mbit").up()
    with pytest.raises(ValueError, match="no namespace was made for 'stage9'"):
        KernelLinks(["coordinator"], "8mbit").host("stage9")
    with pytest.raises(ValueError, match="needs a bandwidth"):
        KernelLinks(["coordinator"], "unlimited")


@pytest.mark.e2e
@needs_netns
def test_a_local_swarm_runs_in_kernel_shaped_namespaces():
    """Every byte a peer's transport sent crossed its namespace's shaped uplink (with headers on top)."""
    spec = preset("tiny", codec="subspace")
    row = _one_run(spec, 2, "80mbit", "0", "kernel", "cpu", None)
    assert row["shaping"] == "kernel" and row["tokens_per_second"] > 0
    tokens = 2 * spec.batch_size * spec.seq_len
    for peer in row["peers"]:
        frames = peer["bytes_sent_per_token"] * tokens
        assert frames > 0 and peer["kernel_uplink_bytes"] > frames
        assert 0 < peer["uplink_busy_fraction"] < 1
