"""A peer started by hand joins a running swarm, and `swarm status` lists every stage and peer,
and right after a peer is killed no longer lists it as serving (though its announcement lives)."""
from __future__ import annotations

import json
import os
import signal
import subprocess

from tests.e2e.conftest import swarm_command, wait_for_event
from tests.e2e.processes import at_once


def test_peer_started_by_hand_joins_and_status_lists_it(make_swarm, session_fork_server, tmp_path):
    swarm = make_swarm(codec="subspace")
    maddrs = swarm.start_coordinator(serving=False)
    swarm.start_peer(1)
    swarm.start_peer(2, "--ttl", "30")  # killed at the end: its announcement outlives it by 20 s or more
    for stage in (1, 2):
        wait_for_event(swarm, f"stage{stage}", "ready")

    # exactly what a volunteer types; --stage auto must pick the uncovered stage 0
    head = swarm.spawn("by-hand", ["peer", "--initial-peers", maddrs[0], "--host-maddrs", "/ip4/127.0.0.1/tcp/0",
                                   "--report", str(swarm.dir / "by-hand.jsonl"), "--steps", "1000"])
    ready = wait_for_event(swarm, "by-hand", "ready")[0]
    assert ready["stage"] == 0
    steps = wait_for_event(swarm, "by-hand", "step", count=3)
    assert steps[2]["loss"] < steps[0]["loss"] + 0.5 and all(s["tokens"] > 0 for s in steps)

    def status(*flags: str) -> subprocess.CompletedProcess:
        # forked from the session's server as the peers are: four runs, while the swarm trains on a 2-core box
        return swarm_command(session_fork_server, ["status", "--initial-peers", maddrs[0], *flags], swarm._env(),
                             tmp_path)

    out, table = at_once(lambda: status("--json"), status)  # both forms, side by side
    assert out.returncode == 0, out.stderr[-2000:]
    state = json.loads(out.stdout)
    assert state["run"]["stages"] == 3 and state["run"]["codec"] == "subspace"
    online = {int(s): [p["peer"] for p in peers if p["state"] == "online"] for s, peers in state["stages"].items()}
    assert online[0] == [ready["peer_id"]]
    assert len(online[1]) == 1 and len(online[2]) == 1

    assert table.returncode == 0 and "online" in table.stdout and ready["peer_id"][-10:] in table.stdout
    assert head.poll() is None, "the head stopped while training"
    assert all(p["answers"] for peers in state["stages"].values() for p in peers), "a live peer failed its probe"

    tail = wait_for_event(swarm, "stage2", "ready")[0]["peer_id"]
    proc = dict(swarm.procs)["stage2"]
    os.killpg(proc.pid, signal.SIGKILL)  # the peer and its p2pd, as a crash or `kill -9` of the group
    proc.wait(timeout=10)
    done, table = at_once(lambda: status("--json"), status)  # both forms again, side by side
    after = json.loads(done.stdout)
    listed = {p["peer"]: p for peers in after["stages"].values() for p in peers}
    assert tail in listed, "its announcement should still live (ttl 30 s); else this check proves nothing"
    assert listed[tail]["answers"] is False and listed[tail]["state"] == "offline", listed[tail]
    assert listed[tail]["announced_state"] == "online"
    # the head lives on; it pauses as soon as it sees stage 2 gone (peer/step/attempt_watch.py: within seconds)
    assert listed[ready["peer_id"]]["answers"] and listed[ready["peer_id"]]["state"] in ("online", "paused")
    assert list(after["paused"]) == ["2"] and "stage 2 has no live replica" in after["paused"]["2"], after["paused"]
    rows = {line.split()[1]: line for line in table.stdout.splitlines() if line.split()[0].isdigit()}
    assert rows["…" + tail[-10:]].split()[2:4] == ["offline", "no"], rows
