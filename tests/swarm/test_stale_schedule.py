"""The in-process pipeline's `schedule` (peer/runner/pipeline.py, issue 54 item 3): "sync" is today's step bit for
bit, and "stale1" is PipeDream-2BW's one-step-stale weights,

    W_{t+1} = W_t - update_t(grad f(W_{t-1}; batch_t)),  W_{-1} = W_0,

checked against that formula with the gradient taken by plain torch autograd at the stored W_{t-1}."""
from __future__ import annotations

import pytest
import torch
from torch.func import functional_call

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.model import lm_loss
from protocol.spec import preset

SEQ = 16


@pytest.fixture(autouse=True)
def one_thread():
    """Bit-equality across pipelines holds on one thread (a multi-threaded reduction may sum in another order)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(None, seq_len=SEQ)


def small(**kw):
    # fp64 everywhere: the wire round trip is exact, so the chained modules are the pipeline's function
    base = dict(d_model=32, n_heads=2, d_ff=64, seq_len=SEQ, n_layers=2, stages=2, batch_size=4,
                microbatch_size=2, rank=4, dtype="fp64", wire_dtype="fp64", lr=3e-3, warmup_steps=1,
                basis_updates=False)
    base.update(kw)
    return preset("tiny", **base)


def weights(pipe: InProcessPipeline) -> list[torch.Tensor]:
    return [p.detach().clone() for r in pipe.runners for p in r.params]


def plain_grads(pipe: InProcessPipeline, at: list[list[torch.Tensor]], step: int, src: BatchSource):
    """grad of the step's loss (the mean over its microbatches) at the weights `at`, by autograd through the
    stage modules chained, each evaluated with `at` in place of its own parameters."""
    names = [[n for n, p in r.module.named_parameters() if p.requires_grad] for r in pipe.runners]
    leaves = [[w.clone().requires_grad_(True) for w in ws] for ws in at]
    n = pipe.spec.n_microbatches
    total = 0.0
    for mb in range(n):
        tokens = src.microbatch(step, mb)
        z = None
        for r, ns, ls in zip(pipe.runners, names, leaves):
            z = functional_call(r.module, dict(zip(ns, ls)), (tokens[:, :-1], z))
        total = total + lm_loss(z, tokens[:, 1:]) / n
    flat = list(torch.autograd.grad(total, [x for ls in leaves for x in ls]))
    return [[flat.pop(0) for _ in ls] for ls in leaves]


def test_sync_is_the_existing_step_bit_for_bit(corpus):
    """The default and an explicit "sync" take the same bits as the step spelled out as it was before
    the option: every microbatch through the pipeline, then every stage's optimizer step."""
    spec = small(codec="subspace")
    src = BatchSource(corpus, SEQ, spec.microbatch_size, seed=3)
    default, sync, by_hand = InProcessPipeline(spec), InProcessPipeline(spec, schedule="sync"), InProcessPipeline(spec)
    for step in range(3):
        a, b = default.train_step(step, src.microbatch), sync.train_step(step, src.microbatch)
        losses = [by_hand._microbatch(step, mb, src.microbatch(step, mb)) for mb in range(spec.n_microbatches)]
        for r in by_hand.runners:
            r.optimizer_step(False)
        assert a.loss == b.loss == sum(losses) / len(losses)
    for x, y, z in zip(weights(default), weights(sync), weights(by_hand)):
        assert torch.equal(x, y) and torch.equal(x, z)


def test_stale1_first_two_steps_follow_the_formula(corpus):
    spec = small(codec="dense")
    src = BatchSource(corpus, SEQ, spec.microbatch_size, seed=5)
    stale = InProcessPipeline(spec, schedule="stale1")
    ref = InProcessPipeline(spec)  # the update operator: the same optimizer, fed the formula's gradients
    w0 = [[p.detach().clone() for p in r.params] for r in ref.runners]
    assert all(torch.equal(x, y) for x, y in zip(weights(stale), weights(ref)))
    # step 0: W_1 = W_0 - update_0(grad f(W_0; b_0)) (W_{-1} = W_0)
    g0 = plain_grads(ref, w0, 0, src)
    stale.train_step(0, src.microbatch)
    # step 1: W_2 = W_1 - update_1(grad f(W_0; b_1)), the gradient at the weights before the last update
    g1 = plain_grads(ref, w0, 1, src)
    stale.train_step(1, src.microbatch)
    for grads in (g0, g1):
        for r, gs in zip(ref.runners, grads):
            for p, g in zip(r.params, gs):
                p.grad = g.clone()
            r._step()  # clip, lr schedule and AdamW moments, as a stage's commit applies them
    for x, y in zip(weights(stale), weights(ref)):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-12)
    # and it is not the sync step: W_2 of sync takes grad f(W_1; b_1)
    assert not all(torch.allclose(x, y) for x, y in zip(weights(stale), weights(_trained(spec, src, 2))))


def _trained(spec, src: BatchSource, steps: int, schedule: str = "sync") -> InProcessPipeline:
    pipe = InProcessPipeline(spec, schedule=schedule)
    for step in range(steps):
        pipe.train_step(step, src.microbatch)
    return pipe


def test_stale1_differs_from_sync_after_step_two_and_equals_it_at_step_one(corpus):
    spec = small(codec="subspace")
    src = BatchSource(corpus, SEQ, spec.microbatch_size, seed=7)
    one_sync, one_stale = _trained(spec, src, 1), _trained(spec, src, 1, "stale1")
    assert all(torch.equal(x, y) for x, y in zip(weights(one_sync), weights(one_stale)))
    sync, stale = _trained(spec, src, 3), _trained(spec, src, 3, "stale1")
    diff = max(float((x - y).abs().max()) for x, y in zip(weights(sync), weights(stale)))
    assert diff > 1e-6


def test_stale1_refuses_basis_updates():
    with pytest.raises(ValueError, match="fixed basis"):
        InProcessPipeline(small(codec="subspace", basis_updates=True, basis_interval=4), schedule="stale1")
    with pytest.raises(ValueError, match="schedule"):
        InProcessPipeline(small(), schedule="stale2")
