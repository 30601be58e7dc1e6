"""A standby head announces a measured speed, never 0 and never a made-up one: the leading head
announces the tokens/s of the last step it drove, and a head that never led the tokens/s of its
own forward pass over one microbatch (it computes nothing for the swarm while it stands by)."""
from __future__ import annotations

from peer.driver import forward_seconds
from protocol.spec import preset
from tests.peer.swarm_in_memory import batches, make_swarm


async def test_a_standby_head_announces_its_measured_forward_speed():
    spec = preset("tiny", stages=2, batch_size=16, microbatch_size=8)
    swarm = await make_swarm(spec, [2, 1])
    try:
        logs = await swarm.drive(3)
    finally:
        await swarm.stop()
    leader, standby = swarm.peers["s0r0"], swarm.peers["s0r1"]
    assert leader.status().throughput == logs[-1].tokens / logs[-1].seconds
    assert standby.daemon.tokens_done == 0, "the standby head computed for the swarm: nothing to compare"
    claimed = standby.status().throughput
    tokens = batches(spec)(0, 0)
    measured = tokens.shape[0] * spec.seq_len / forward_seconds(standby.runner, tokens)
    # the same measurement again, on a shared machine: equal within timing noise
    assert measured / 20 < claimed < measured * 20, f"announced {claimed:.0f} tokens/s, measured {measured:.0f}"
