"""A swarm spread over network namespaces, joined the way the README says (examples/two_machines),
with two volunteers each behind a NAT router that forwards no port: each is told that nobody
can dial it, serves its stage through a relay, `swarm status` and the dashboard show both as
relayed, and the swarm trains.

    coordinator 10.99.0.10   peer A 10.99.0.11          (one bridge: the "internet")
    peer B 192.168.99.2 behind its router 10.99.0.12    (masquerade, no port forward)
    peer C 192.168.99.2 behind its router 10.99.0.13    (another LAN, the same address)

Nobody can open a connection to B or C: the coordinator's fresh probe host fails at their own
addresses and gets through at their relay circuits (the dial-back check, logged by it). B and
C serve neighbouring stages, and neither can dial the other: every byte between them
(activations B -> C, gradients C -> B) crosses the coordinator, their relay, whose network
interface must carry at least those bytes. (With A, B and C reuse the connections they opened
themselves, in both directions, as libp2p does: that traffic is direct.)

Needs root, iproute2 and nftables (skipped with the reason elsewhere).
"""
from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time

import pytest

from swarm.local_reports import report_events as events
from tests.e2e.processes import at_once
from tests.e2e.scripts import EXAMPLES, Scripts, swarm_on_path
from tests.netlab import NetLab, missing_requirements

pytestmark = pytest.mark.skipif(bool(missing_requirements()), reason=str(missing_requirements()))

COORDINATOR, PEER = EXAMPLES / "two_machines" / "coordinator.sh", EXAMPLES / "two_machines" / "peer.sh"


def wait_for_event(scripts: Scripts, name: str, event: str, count: int = 1, timeout: float = 180.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        exited = scripts.procs[name].poll() is not None  # looked at before the report: it may write, then exit
        found = [e for e in events(scripts.dir / f"{name}.jsonl") if e["event"] == event]
        if len(found) >= count:
            return found
        if exited or time.monotonic() > deadline:
            pytest.fail(f"{name} reported {len(found)} {event!r} events, not {count} (exit code "
                        f"{scripts.procs[name].poll()}); its log ends with:\n{scripts.log(name)[-4000:]}")
        time.sleep(0.2)  # poll interval of a report another process writes


def poll_dashboard(lab: NetLab, host, expect_online: int, timeout: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        out = lab.run(host, sys.executable, str(EXAMPLES / "dashboard_api.py"), "http://127.0.0.1:8080/", "--json")
        summary = json.loads(out.stdout) if out.returncode == 0 else {}
        if summary.get("peers_online") == expect_online:
            return summary
        if time.monotonic() > deadline:
            pytest.fail(f"the dashboard never showed {expect_online} online peers: {out.stdout} {out.stderr}")
        time.sleep(0.5)  # poll interval of the dashboard, which refreshes every 1.5 s


def interface_bytes(lab: NetLab, host) -> dict[str, int]:
    out = lab.run(host, "ip", "-s", "-j", "link", "show", "eth0")
    stats = json.loads(out.stdout)[0]["stats64"]
    return {"rx": stats["rx"]["bytes"], "tx": stats["tx"]["bytes"]}


def test_swarm_across_namespaces_with_a_relayed_peer(tmp_path):
    scripts = Scripts(tmp_path, swarm_on_path(tmp_path / "bin"))
    with NetLab() as lab:
        try:
            hosts = {"coordinator": lab.public_host("coord"), "a": lab.public_host("a"), "b": lab.nat_host("b"),
                     "c": lab.nat_host("c")}
            scripts.start("coordinator", ["bash", COORDINATOR], hosts["coordinator"].prefix(),
                          STATE_DIR=str(tmp_path / "coordinator"))
            address = scripts.coordinator_address()
            assert address.startswith(f"/ip4/{hosts['coordinator'].ip}/tcp/31337/p2p/"), address

            # each volunteer runs peer.sh with the printed address; A is the head (stage 0), B gets stage 1
            for name, extra in (("a", ["--steps", "1000", "--join-timeout", "240"]), ("b", []), ("c", [])):
                scripts.start(name, ["bash", PEER, address, "--report", tmp_path / f"{name}.jsonl", *extra],
                              hosts[name].prefix(), STATE_DIR=str(tmp_path / name))
                ready = wait_for_event(scripts, name, "ready")[0]
                assert ready["stage"] == {"a": 0, "b": 1, "c": 2}[name]
            ready = {name: wait_for_event(scripts, name, "ready")[0] for name in "abc"}
            assert ready["a"]["reachability"] == "direct"
            # a direct peer announces its bridge address, never 127.0.0.1
            assert ready["a"]["maddrs"] and all(m.startswith(f"/ip4/{hosts['a'].ip}/") for m in ready["a"]["maddrs"])
            for name in "bc":  # a relayed peer announces its circuit through the coordinator, nothing else
                assert ready[name]["reachability"] == "relayed"
                assert ready[name]["maddrs"] and all(f"/ip4/{hosts['coordinator'].ip}/tcp/31337/p2p/" in m
                                                     and "/p2p-circuit" in m for m in ready[name]["maddrs"])
                assert "serving through a relay" in scripts.log(name)

            # the dashboard (in A's namespace) comes up while the swarm trains and `swarm status` runs
            scripts.start("dashboard", [sys.executable, "-m", "swarm.cli", "dashboard", "--initial-peers", address,
                                        "--port", "8080"], hosts["a"].prefix())
            steps = wait_for_event(scripts, "a", "step", count=4)
            assert steps[-1]["loss"] < steps[0]["loss"] + 0.5 and all(s["tokens"] > 0 for s in steps)

            def run_status(*flags: str) -> subprocess.CompletedProcess:
                return lab.run(hosts["a"], sys.executable, "-m", "swarm.cli", "status", "--initial-peers", address,
                               *flags, timeout=120)

            status, table = at_once(lambda: run_status("--json"), run_status)  # both forms, side by side
            assert status.returncode == 0, status.stderr[-2000:]
            reach = {p["peer"]: p["reachability"] for peers in json.loads(status.stdout)["stages"].values()
                     for p in peers if p["state"] == "online"}
            assert reach == {ready["a"]["peer_id"]: "direct", ready["b"]["peer_id"]: "relayed",
                             ready["c"]["peer_id"]: "relayed"}
            assert "relayed" in table.stdout and ready["b"]["peer_id"][-10:] in table.stdout

            # the dashboard shows B as relayed too: read by examples/dashboard_api.py
            summary = poll_dashboard(lab, hosts["a"], expect_online=3)
            assert summary["relayed_peers"] == sorted([ready["b"]["peer_id"], ready["c"]["peer_id"]])
            assert summary["stages_covered"] == 3

            # nobody can dial B itself (no route to its LAN): its relay circuit is the only way in
            dial = lab.run(hosts["a"], sys.executable, "-c", "import socket, sys; s = socket.socket(); "
                           f"s.settimeout(3); sys.exit(s.connect_ex(('{hosts['b'].ip}', 9)))")
            assert dial.returncode == errno.ENETUNREACH, dial
            for name in ("a", "b", "c", "dashboard"):
                assert scripts.procs[name].poll() is None, scripts.log(name)[-3000:]

            # the coordinator dialed B and C back: in vain at their own addresses, and through their circuits
            for name in "bc":
                dials = [line for line in scripts.log("coordinator").splitlines() if "dial-back to" in line
                         and ready[name]["peer_id"][-8:] in line]
                assert any("/ip4/192.168.99.2/" in line and "reached" not in line for line in dials), dials
                assert any("/p2p-circuit" in line and line.endswith(": reached") for line in dials), dials

            # stop the peers (each reports the bytes it sent as it leaves): each byte B and C sent each
            # other entered the coordinator's interface once and left it once
            for name in "abc":
                scripts.procs[name].send_signal(signal.SIGTERM)
            wire = {name: wait_for_event(scripts, name, "wire", timeout=60)[0] for name in "abc"}
            between = wire["b"]["bytes_out"]["act"] + wire["c"]["bytes_out"]["grad"]
            relay = interface_bytes(lab, hosts["coordinator"])
            print(f"bytes between B and C: {between}; through the coordinator: {relay}")
            assert between > 100_000
            assert relay["rx"] >= between and relay["tx"] >= between
        finally:
            scripts.stop()
    assert not subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.count(lab.tag)


def test_peer_behind_a_forwarded_port_is_direct_with_public_ip(tmp_path):
    """A volunteer who forwarded a port and passed --public-ip (the README's advice) is direct."""
    scripts = Scripts(tmp_path, swarm_on_path(tmp_path / "bin"))
    with NetLab() as lab:
        try:
            coordinator, home = lab.public_host("coord"), lab.nat_host("home", forward=31338)
            router_ip = lab.hosts["home-nat"].ip
            scripts.start("coordinator", ["bash", COORDINATOR], coordinator.prefix(),
                          STATE_DIR=str(tmp_path / "coordinator"))
            address = scripts.coordinator_address()
            scripts.start("home", ["bash", PEER, address, "--stage", "1", "--public-ip", router_ip,
                                   "--report", tmp_path / "home.jsonl"], home.prefix(), PORT="31338",
                          STATE_DIR=str(tmp_path / "home"))
            ready = wait_for_event(scripts, "home", "ready")[0]
            assert ready["reachability"] == "direct"
            assert ready["maddrs"] == [f"/ip4/{router_ip}/tcp/31338/p2p/{ready['peer_id']}"]
            dials = [line for line in scripts.log("coordinator").splitlines() if "dial-back to" in line]
            assert any(f"/ip4/{router_ip}/tcp/31338" in line and line.endswith(": reached") for line in dials), dials
        finally:
            scripts.stop()
