"""The daemon's behaviour over the in-memory loopback network: it trains exactly like the
in-process pipeline, and a delivered message whose reply was lost is neither lost nor applied twice."""
from __future__ import annotations

import torch

from peer.daemon import KIND_BACKWARD, KIND_FORWARD, StageDaemon
from peer.data import BatchSource, load_corpus
from peer.interfaces import LinkError
from peer.loopback import LoopbackLink, LoopbackNetwork
from peer.pipeline import InProcessPipeline
from peer.stage import StageRunner
from protocol.spec import preset

STEPS = 6


class LossyLink(LoopbackLink):
    """Delivers every request, but loses the reply of every third new message (a transient
    failure: the sender sees an error, and a repeat of the same message gets its reply)."""

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        seen = self.net.__dict__.setdefault("seen", set())
        if body not in seen:
            seen.add(body)
            self.net.sent = getattr(self.net, "sent", 0) + 1
            if self.net.sent % 3 == 0:
                raise LinkError("the stream closed before the reply arrived")
        return reply


async def _train(link_cls) -> tuple[list[float], list[StageDaemon], LoopbackNetwork]:
    spec = preset("tiny", stages=3)
    src = BatchSource(load_corpus(None, seq_len=spec.seq_len), spec.seq_len, spec.microbatch_size, spec.data_seed)
    net = LoopbackNetwork()
    daemons = [StageDaemon(StageRunner(spec, s), link_cls(net, f"p{s}"), net.directory(f"p{s}"),
                           batches=src.microbatch if s == 0 else None) for s in range(3)]
    for d in daemons:
        await d.start()
    try:
        losses = [(await daemons[0].train_step()).loss for _ in range(STEPS)]
    finally:
        for d in daemons:
            await d.stop()
    return losses, daemons, net


def _oracle() -> list[float]:
    spec = preset("tiny", stages=3)
    src = BatchSource(load_corpus(None, seq_len=spec.seq_len), spec.seq_len, spec.microbatch_size, spec.data_seed)
    pipe = InProcessPipeline(spec)
    return [pipe.train_step(s, src.microbatch).loss for s in range(STEPS)]


async def test_daemons_over_loopback_equal_the_pipeline():
    losses, daemons, _ = await _train(LoopbackLink)
    assert losses == _oracle()
    tokens = STEPS * 16 * 64
    assert [d.sent_tokens[KIND_FORWARD] for d in daemons] == [tokens, tokens, 0]
    assert [d.sent_tokens[KIND_BACKWARD] for d in daemons] == [0, tokens, tokens]
    assert all(d.refused == 0 for d in daemons)


async def test_lost_replies_are_neither_lost_nor_applied_twice():
    losses, daemons, net = await _train(LossyLink)
    assert net.sent >= 4 * STEPS * 2  # two boundaries, both directions, two microbatches a step
    assert losses == _oracle()  # every microbatch applied exactly once
    tokens = STEPS * 16 * 64
    assert [d.sent_tokens[KIND_FORWARD] for d in daemons] == [tokens, tokens, 0]
    assert [d.sent_tokens[KIND_BACKWARD] for d in daemons] == [0, tokens, tokens]
    assert sum(d.refused for d in daemons) > 0  # the repeats were recognised and refused as duplicates
    assert all(torch.isfinite(p).all() for d in daemons for p in d.runner.module.parameters())
