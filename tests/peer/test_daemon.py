"""The peers' behaviour over the in-memory loopback network: one replica per stage trains
exactly like the in-process pipeline, and a delivered message whose reply was lost is neither
lost nor applied twice."""
from __future__ import annotations

import torch

from peer.interfaces import LinkError
from peer.loopback import LoopbackLink
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT
from tests.peer.swarm_in_memory import make_swarm, oracle

STEPS = 6


class LossyLink(LoopbackLink):
    """Delivers every request, but loses the reply of every third new boundary message (a
    transient failure: the sender sees an error, and a repeat of the same message gets its reply)."""

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        if kind not in (KIND_ACTIVATION, KIND_GRADIENT):
            return reply
        seen = self.net.__dict__.setdefault("seen", set())
        if body not in seen:
            seen.add(body)
            self.net.sent = getattr(self.net, "sent", 0) + 1
            if self.net.sent % 3 == 0:
                raise LinkError("the stream closed before the reply arrived")
        return reply


async def _train(link_cls):
    spec = preset("tiny", stages=3)
    swarm = await make_swarm(spec, [1, 1, 1], link_cls)
    try:
        logs = await swarm.drive(STEPS)
    finally:
        await swarm.stop()
    return spec, [log.loss for log in logs], swarm


async def test_daemons_over_loopback_equal_the_pipeline():
    spec, losses, swarm = await _train(LoopbackLink)
    assert losses == oracle(spec, STEPS)
    tokens = STEPS * 16 * 64
    daemons = [swarm.stage(s)[0].daemon for s in range(3)]
    assert [d.sent_tokens[KIND_ACTIVATION] for d in daemons] == [tokens, tokens, 0]
    assert [d.sent_tokens[KIND_GRADIENT] for d in daemons] == [0, tokens, tokens]
    assert all(d.refused == 0 for d in daemons)
    assert all(log.attempts == 1 for log in swarm.logs)


async def test_lost_replies_are_neither_lost_nor_applied_twice():
    spec, losses, swarm = await _train(LossyLink)
    assert swarm.net.sent >= 4 * STEPS * 2  # two boundaries, both directions, two microbatches a step
    assert losses == oracle(spec, STEPS)  # every microbatch applied exactly once
    tokens = STEPS * 16 * 64
    daemons = [swarm.stage(s)[0].daemon for s in range(3)]
    assert [d.sent_tokens[KIND_ACTIVATION] for d in daemons] == [tokens, tokens, 0]
    assert [d.sent_tokens[KIND_GRADIENT] for d in daemons] == [0, tokens, tokens]
    assert sum(d.refused for d in daemons) > 0  # the repeats were recognised and refused as duplicates
    assert all(torch.isfinite(p).all() for d in daemons for p in d.runner.module.parameters())
