"""Every head works (issue 22, item 1) in a real swarm (separate processes over libp2p): 2 heads and
1 peer of stage 1; once the leader has heard from the second head, both compute a share of every
step, their contributions are summed, the leader recomputes the other head's share at every step
(spot-check rate 1) and finds it its work, and the run still equals the one-head oracle step for step.
Each head keeps one microbatch in flight at a time (`RunSpec.microbatches_in_flight` = 1: the window path
over real links; the in-memory tests cover the default of the whole share at once)."""
from __future__ import annotations

import asyncio
import re

from protocol.spec import preset
from swarm.local import LocalOptions, LocalSwarm
from tests.e2e.conftest import follow_beside_oracle, wait_for_event


async def test_a_second_head_computes_a_share_of_every_step_and_the_run_equals_one_heads(tmp_path):
    steps = 30
    spec = preset("tiny", stages=2, batch_size=32, microbatch_size=8, lr=1e-3, microbatches_in_flight=1)
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, replicas=2, workdir=str(tmp_path / "heads"), threads=1,
                                    quiet=True, extra_peer_args=["--ttl", "6"]))
    first, second = swarm.head_names()
    try:
        await asyncio.to_thread(swarm.start_coordinator, serving=False)
        swarm.start_peer(1, name="stage1")
        for name in (first, second):  # two volunteers' heads, started together: one leads, both work
            swarm.start_peer(0, "--steps", str(steps), "--spot-check-rate", "1", name=name)
        for name in (first, second, "stage1"):
            await asyncio.to_thread(wait_for_event, swarm, name, "ready", 120)
        records, oracle_losses = await follow_beside_oracle(swarm, spec, steps)
    finally:
        await asyncio.to_thread(swarm.stop)
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    shared = [r for r in records if len([h for h, n in r["heads"].items() if n > 0]) == 2]
    assert shared, "the second head never computed a share"
    joined = shared[0]["step"]
    assert joined <= 5, f"the second head took until step {joined} to get a share"
    for r in records[joined - 1:]:  # from its first share on, both heads computed microbatches at every step
        assert len(r["heads"]) == 2 and min(r["heads"].values()) >= 1, (r["step"], r["heads"])
        assert sum(r["heads"].values()) == spec.n_microbatches
    # and the head that did not drive a step says in its log that it computed its share of it
    drove = {n: {e["step"] for e in swarm.events(n) if e["event"] == "step"} for n in (first, second)}
    said = {n: {int(m) for m in re.findall(r"step (\d+): computed \d+ microbatch",
                                           (swarm.dir / f"{n}.log").read_text())} for n in (first, second)}
    checked = {n: {int(m) for m in re.findall(r"step (\d+): stage 0: \S+'s share, recomputed by this head, is its work",
                                              (swarm.dir / f"{n}.log").read_text())} for n in (first, second)}
    for step in range(joined, steps + 1):
        helper, leader = (second, first) if step in drove[first] else (first, second)
        assert step in said[helper], f"step {step}: {helper} logged no share of it ({sorted(said[helper])})"
        # at rate 1 the leader recomputed the other head's share over the network, and found it its work
        assert step in checked[leader], f"step {step}: {leader} logged no check of the other head's share"
    # every microbatch was applied exactly once: the run is the one-head oracle's, step for step
    for step, (r, want) in enumerate(zip(records, oracle_losses), start=1):
        assert abs(r["loss"] - want) <= 1e-5 * abs(want), f"step {step}: swarm {r['loss']} vs oracle {want}"
