"""A tiny internet made of Linux network namespaces, for tests that need real addresses, a
router with NAT and a peer that nobody can dial.

    hub namespace: a bridge, the "internet" (10.99.0.0/24)
      public host  -- veth --  bridge           (e.g. the coordinator at 10.99.0.10)
      NAT router   -- veth --  bridge           (its public side, e.g. 10.99.0.20)
        private host -- veth -- router          (192.168.99.2, default route via the router,
                                                 which masquerades it: no port is forwarded)

Hosts on the bridge reach each other directly; a private host reaches out through its
router's NAT, and nobody can open a connection to it (the hub has no route to its LAN, and
the router forwards no port). Needs root, `ip` (iproute2) and, for NAT, `nft` (nftables).
Every address lives inside namespaces this lab made; `close()` deletes them all, also after
a failure (use it as a context manager).
"""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

HUB_SUBNET = "10.99.0"
LAN_SUBNET = "192.168.99"


def missing_requirements(nat: bool = True) -> str | None:
    """Why this machine cannot build a lab (None if it can): the reason a test is skipped with."""
    if os.geteuid() != 0:
        return "network-namespace test: needs root (ip netns)"
    if shutil.which("ip") is None:
        return "network-namespace test: needs iproute2's `ip`"
    if nat and shutil.which("nft") is None:
        return "network-namespace test: needs `nft` for the NAT router (apt-get install -y nftables, as .ci/run does)"
    probe = f"sslabprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"network-namespace test: `ip netns add` fails here ({made.stderr.strip()})"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass
class Host:
    """One machine of the lab: a namespace and its address on its network."""

    name: str
    namespace: str
    ip: str

    def prefix(self) -> list[str]:
        """The command prefix that runs a program on this host."""
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class NetLab:
    tag: str = field(default_factory=lambda: f"ss{os.getpid() % 100000}")
    hosts: dict[str, Host] = field(default_factory=dict)
    _namespaces: list[str] = field(default_factory=list)
    _next: int = 10

    def __post_init__(self) -> None:
        self.hub = self._namespace("hub")
        self._ip(self.hub, "link", "add", "br0", "type", "bridge")
        self._ip(self.hub, "link", "set", "br0", "up")

    # ------------------------------------------------------------------ building
    def _namespace(self, name: str) -> str:
        ns = f"{self.tag}-{name}"
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # a leftover of a killed run
        self._run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        self._ip(ns, "link", "set", "lo", "up")
        return ns

    def _run(self, *cmd: str) -> None:
        done = subprocess.run(list(cmd), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()}")

    def _ip(self, ns: str, *args: str) -> None:
        self._run("ip", "-n", ns, *args)

    def _plug(self, ns: str) -> str:
        """A veth from the hub's bridge to `ns` (named eth0 there); returns its address on the hub."""
        ip = f"{HUB_SUBNET}.{self._next}"
        port = f"v{self.tag[-6:]}{self._next}"  # interface names have at most 15 characters
        self._next += 1
        self._ip(self.hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip(self.hub, "link", "set", port, "master", "br0", "up")
        self._ip(ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        self._ip(ns, "link", "set", "eth0", "up")
        return ip

    def public_host(self, name: str) -> Host:
        """A host on the bridge: everyone can dial it."""
        ns = self._namespace(name)
        host = self.hosts[name] = Host(name, ns, self._plug(ns))
        return host

    def nat_host(self, name: str, forward: int | None = None) -> Host:
        """A host behind its own NAT router (masquerade): it can dial out, and nobody can dial in,
        except on TCP port `forward` if given, which the router forwards to it (same port)."""
        router = self._namespace(f"{name}-nat")
        public_ip = self._plug(router)
        ns = self._namespace(name)
        self._ip(router, "link", "add", "lan0", "type", "veth", "peer", "name", "eth0", "netns", ns)
        self._ip(router, "addr", "add", f"{LAN_SUBNET}.1/24", "dev", "lan0")
        self._ip(router, "link", "set", "lan0", "up")
        self._ip(ns, "addr", "add", f"{LAN_SUBNET}.2/24", "dev", "eth0")
        self._ip(ns, "link", "set", "eth0", "up")
        self._ip(ns, "route", "add", "default", "via", f"{LAN_SUBNET}.1")
        self._run("ip", "netns", "exec", router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        forwarding = "" if not forward else (
            " chain prerouting {\n  type nat hook prerouting priority -100; policy accept;\n"
            f'  iifname "eth0" tcp dport {forward} dnat to {LAN_SUBNET}.2:{forward}\n }}\n')
        rules = ("table ip nat {\n chain postrouting {\n  type nat hook postrouting priority 100; policy accept;\n"
                 f'  oifname "eth0" ip saddr {LAN_SUBNET}.0/24 masquerade\n }}\n{forwarding}}}\n')
        done = subprocess.run(["ip", "netns", "exec", router, "nft", "-f", "-"], input=rules, capture_output=True,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nft in {router} failed: {done.stderr.strip()}")
        self.hosts[f"{name}-nat"] = Host(f"{name}-nat", router, public_ip)
        host = self.hosts[name] = Host(name, ns, f"{LAN_SUBNET}.2")
        return host

    # ------------------------------------------------------------------ using
    def run(self, host: Host, *cmd: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run([*host.prefix(), *cmd], capture_output=True, text=True, timeout=timeout)

    def close(self) -> None:
        """Delete every namespace of the lab (their veths go with them)."""
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self._namespaces.clear()

    def __enter__(self) -> NetLab:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
