"""Kernel link shaping: each process of a local swarm in its own network namespace, its home
connection shaped by the kernel (tc's token bucket filter) instead of by `HomeLink`.

This room exists so that the built-in shaper can be checked against the kernel: same swarm,
same bandwidth, real TCP with its headers, acknowledgements and congestion control.

Layout, all inside namespaces this run creates (names carry a random tag; nothing is added to
the machine's own network namespace, so private addresses cannot clash with anything):

- a hub namespace `<tag>-hub` holding a bridge `br0`;
- per process (coordinator, stage0, ...): a namespace `<tag>-<name>` and a veth pair, `eth0`
  inside it with address 10.213.0.<i+2>/24 and `v<i>` in the hub, enslaved to the bridge;
- `tbf` on `eth0` (the host's uplink: all it sends) and on `v<i>` (its downlink: all the bridge
  sends it), rate = the bandwidth, burst = the built-in bucket's depth (max(64 KiB, 10 ms of
  bandwidth)), and a queue of one burst plus 50 ms of bandwidth. A deeper queue (bufferbloat)
  inflates the round trip to seconds, and then libp2p's per-stream flow-control window (yamux,
  256 KiB to start; one stream per message here) rather than the bandwidth limits a transfer.

Latency: `netem` is not in every kernel (not in this project's CI machines'), so one-way
latency, when asked for, stays with the built-in shaper (bandwidth unlimited there).
Needs root, `ip netns` and `tc`; `KernelLinks.up()` raises `KernelShapingUnavailable` with the
reason where they are missing or refused. Every namespace (and with it every veth and the
bridge) is deleted on exit, on error and on Ctrl+C or SIGTERM.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
from types import FrameType

from .shaper import BUCKET_SECONDS, MIN_BUCKET_BYTES, parse_bandwidth

SUBNET = "10.213.0"
QUEUE_SECONDS = 0.050


class KernelShapingUnavailable(RuntimeError):
    """This machine cannot shape links in the kernel; the message says why."""


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, cmd, done.stdout, done.stderr)
    return done.stdout


class KernelLinks:
    """Namespaces, veths and tbf qdiscs for the processes `names`; a `Placement` (swarm/local.py)."""

    def __init__(self, names: list[str], bandwidth: str, downlink: bool = True) -> None:
        bps = parse_bandwidth(bandwidth)
        if bps is None:
            raise ValueError("kernel shaping needs a bandwidth such as 8mbit, not 'unlimited'.")
        if len(names) > 250:
            raise ValueError("kernel shaping places at most 250 processes.")
        self.names, self.bps, self.downlink = list(names), bps, downlink
        self.tag = "sw" + secrets.token_hex(3)
        self.hub = f"{self.tag}-hub"
        self._created: list[str] = []
        self._old_sigterm = None

    # ------------------------------------------------------------------ placement
    def namespace(self, name: str) -> str:
        self._index(name)
        return f"{self.tag}-{name}"

    def _index(self, name: str) -> int:
        if name not in self.names:
            raise ValueError(f"no namespace was made for {name!r}; kernel shaping places {', '.join(self.names)}.")
        return self.names.index(name)

    def prefix(self, name: str) -> list[str]:
        return ["ip", "netns", "exec", self.namespace(name)]

    def host(self, name: str) -> str:
        return f"{SUBNET}.{self._index(name) + 2}"

    # ------------------------------------------------------------------ life cycle
    @property
    def burst_bytes(self) -> int:
        return int(max(MIN_BUCKET_BYTES, self.bps / 8 * BUCKET_SECONDS))

    def _tbf(self, namespace: str, dev: str) -> None:
        limit = int(self.burst_bytes + self.bps / 8 * QUEUE_SECONDS)
        _run("tc", "-n", namespace, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{int(self.bps)}bit",
             "burst", str(self.burst_bytes), "limit", str(limit))

    def _add_namespace(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._created.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")

    def up(self) -> KernelLinks:
        if os.geteuid() != 0:
            raise KernelShapingUnavailable("kernel shaping needs root (to create network namespaces); "
                                           "run as root or leave --kernel-shaping out.")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise KernelShapingUnavailable(f"kernel shaping needs `{tool}` (iproute2), which is not installed.")
        try:
            self._add_namespace(self.hub)
            _run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.hub, "link", "set", "br0", "up")
            for i, name in enumerate(self.names):
                ns = f"{self.tag}-{name}"
                self._add_namespace(ns)
                _run("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"v{i}",
                     "netns", self.hub)
                _run("ip", "-n", self.hub, "link", "set", f"v{i}", "master", "br0", "up")
                _run("ip", "-n", ns, "addr", "add", f"{self.host(name)}/24", "dev", "eth0")
                _run("ip", "-n", ns, "link", "set", "eth0", "up")
                self._tbf(ns, "eth0")
                if self.downlink:
                    self._tbf(self.hub, f"v{i}")
        except subprocess.CalledProcessError as e:
            self.down()
            said = (e.stderr or "").strip().replace("\n", " ")[:200]
            raise KernelShapingUnavailable(f"kernel shaping is not possible here (`{' '.join(e.cmd)}` said: "
                                           f"{said}); leave --kernel-shaping out.") from None
        except (subprocess.TimeoutExpired, OSError) as e:
            self.down()
            raise KernelShapingUnavailable(f"kernel shaping is not possible here ({e}); "
                                           f"leave --kernel-shaping out.") from None
        return self

    def down(self) -> None:
        """Delete every namespace this run made (their veths, qdiscs and the bridge go with them)."""
        for ns in reversed(self._created):
            try:
                _run("ip", "netns", "del", ns)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
                pass  # already gone
        self._created.clear()

    def __enter__(self) -> KernelLinks:
        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            raise KeyboardInterrupt  # unwinds through __exit__, which removes the namespaces

        self.up()
        self._old_sigterm = signal.signal(signal.SIGTERM, on_sigterm)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.down()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    # ------------------------------------------------------------------ what the kernel measured
    def _sent_bytes(self, namespace: str, dev: str) -> int:
        out = json.loads(_run("tc", "-n", namespace, "-s", "-j", "qdisc", "show", "dev", dev) or "[]")
        return sum(int(q.get("bytes", 0)) for q in out if q.get("root"))

    def stats(self) -> dict[str, dict[str, float]]:
        """Per process: bytes through its uplink and downlink qdiscs (IP packets, headers included),
        and the seconds they kept the line busy, bytes * 8 / rate (as `HomeLink.stats` counts them)."""
        out = {}
        for i, name in enumerate(self.names):
            up = self._sent_bytes(f"{self.tag}-{name}", "eth0")
            down = self._sent_bytes(self.hub, f"v{i}") if self.downlink else 0
            out[name] = {"uplink_bytes": up, "uplink_busy_s": up * 8 / self.bps,
                         "downlink_bytes": down, "downlink_busy_s": down * 8 / self.bps}
        return out
