"""What ids that announce stage 0 cost a failover while the lease names them before the next honest head
(docs/security.md, Who leads): a swarm in memory (`tiny`, two stages, two heads and one stage-1 replica, the
driver's and the commit's default timings: a standby pings the leader every 1 s and counts it dead after 3 failures
in a row), the lease naming the leader, then K fake ids that announce stage 0 and answer nothing (a request to one
fails at once, as to an address that refuses), then the standby head. The leader is killed right after a step; the
failover is the time from the kill to the first step the standby applies, the step's own time included. K = 0 and
3, each run `RUNS` times. The real `Succession` and `leader_of` decide; only the network is the in-memory loopback.
Usage: python docs/results/fake_heads_failover.py OUT.json"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import statistics
import sys
import time

import torch

from peer.daemon.interfaces import PeerStatus
from peer.daemon.loopback import LoopbackNetwork
from peer.replica.memory_swarm import MemorySwarm
from protocol.spec import preset

RUNS, FAKES, KILL_AFTER, STEPS = 3, 3, 3, 5


async def failover(fakes: int) -> dict:
    spec = preset("tiny", stages=2, basis_updates=False)
    swarm = MemorySwarm(spec, LoopbackNetwork(), driver_options={}, commit_options={})  # the defaults
    for name, stage in (("s0r0", 0), ("s0r1", 0), ("s1r0", 1)):
        await swarm.add(stage, name)
    ids = [f"s0fake{i}" for i in range(fakes)]
    for fake in ids:  # announced, online, stage 0; serves nothing
        swarm.net.status[fake] = PeerStatus(0, "online")
    swarm.net.lease = ["s0r0", *ids, "s0r1"]
    marks: dict[str, float] = {}

    def on_step(log) -> None:
        if len(swarm.logs) == KILL_AFTER and "kill" not in marks:
            marks["kill"] = time.monotonic()
            swarm.kill("s0r0")
        elif "kill" in marks and "next" not in marks:
            marks["next"], marks["next_step_s"] = time.monotonic(), log.seconds
    try:
        await asyncio.wait_for(swarm.drive(STEPS, on_step), 600)
    finally:
        await swarm.stop()
    steps = [log.seconds for log in swarm.logs[:KILL_AFTER]]
    return {"failover_s": marks["next"] - marks["kill"], "its_step_s": marks["next_step_s"],
            "steps_before_s": steps}


def main(out: str) -> None:
    logging.disable(logging.WARNING)  # each failed ping and dead leader is logged
    torch.set_num_threads(1)
    rows: dict = {"runs": RUNS, "cpus": os.cpu_count(), "load_1min_before": os.getloadavg()[0]}
    for k in (0, FAKES):
        runs = [asyncio.run(failover(k)) for _ in range(RUNS)]
        times = [r["failover_s"] for r in runs]
        rows[f"fakes_{k}"] = {"runs": runs, "failover_median_s": statistics.median(times),
                              "failover_min_s": min(times), "failover_max_s": max(times)}
    rows["load_1min_after"] = os.getloadavg()[0]
    print(json.dumps(rows, indent=1))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
