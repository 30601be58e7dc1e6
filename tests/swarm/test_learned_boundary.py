"""The learned per-stage projection diagnostic (swarm/bench/fidelity/learned_boundary.py): its gradient is the one-graph
gradient (both halves of U's), U stays orthonormal, the receiver rebuilds exactly what span(U) passes, and the
fidelity bench trains each variant."""
from __future__ import annotations

import math

import pytest
import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.model import lm_loss
from protocol.spec import preset
from swarm.bench.fidelity.learned_boundary import LEARNED_BOUNDARIES, LearnedDecoder, LearnedEncoder, learned_boundaries
from swarm.bench.fidelity.plan import dense, plan_shape
from swarm.bench.fidelity.train import Job, train_job


def _spec(**kw):
    return preset("tiny", codec="dense", d_model=32, n_heads=2, d_ff=64, seq_len=16, n_layers=3, stages=3,
                  batch_size=4, microbatch_size=4, rank=4, dtype="fp64", wire_dtype="fp64", lr=1e-3,
                  basis_updates=False, **kw)


def test_the_pipeline_gradient_of_a_learned_boundary_is_the_one_graph_gradient():
    """fp64: the sender's and the receiver's halves of dL/dW, accumulated by two runners' backward passes,
    equal autograd through the whole chain; so does every other parameter's gradient."""
    spec = _spec()
    src = BatchSource(load_corpus(None, seq_len=16), 16, 4, seed=3)
    pipe = InProcessPipeline(spec, serialize=False)
    learned_boundaries(pipe, "learned")
    with torch.no_grad():  # anchors away from zero, so that their gradient path is exercised too
        for r in pipe.runners[:-1]:
            r.module.encoder.proj.A.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(r.stage))
    tokens = src.microbatch(0, 0)
    z = None
    for r in pipe.runners[:-1]:
        z = pipe.packer.roundtrip(r.forward(0, 0, tokens, z))
    _, g = pipe.runners[-1].forward_backward(0, 0, tokens, z)
    W1 = pipe.runners[1].module.encoder.proj.W
    receiver_half = W1.grad.clone()  # the last stage's decoder alone so far
    for s in (1, 0):
        g, overflow = pipe.runners[s + 1].boundary_gradient(0, g)
        g = pipe.runners[s].backward(0, 0, pipe.packer.roundtrip(g), overflow)
    assert float(receiver_half.norm()) > 0 and float((W1.grad - receiver_half).norm()) > 0  # both halves count
    params = [p for r in pipe.runners for p in r.params]
    piped = [p.grad.clone() for p in params]
    assert len({id(p) for p in params}) == len(params)  # each W and A is in exactly one stage's list
    for p in params:
        p.grad = None
    z = None
    for r in pipe.runners:
        z = r.module(tokens[:, :-1], z)
    one_graph = torch.autograd.grad(lm_loss(z, tokens[:, 1:]), params)
    for a, b in zip(piped, one_graph):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-14)


def test_learned_projection_rebuilds_exactly_what_its_span_passes_and_stays_orthonormal():
    spec = _spec()
    src = BatchSource(load_corpus(None, seq_len=16), 16, 4, seed=5)
    pipe = InProcessPipeline(spec, serialize=False)
    learned_boundaries(pipe, "learned")
    W0 = pipe.runners[0].module.encoder.proj.W.detach().clone()
    losses = [pipe.train_step(step, src.microbatch).loss for step in range(20)]
    assert losses[-1] < losses[0] - 0.1
    enc, dec = pipe.runners[0].module.encoder, pipe.runners[1].module.decoder
    assert isinstance(enc, LearnedEncoder) and isinstance(dec, LearnedDecoder)
    assert float((enc.proj.W.detach() - W0).norm()) > 1e-4  # U trained
    U = enc.proj.basis()
    assert torch.allclose(U.T @ U, torch.eye(spec.rank, dtype=U.dtype), atol=1e-12)
    tokens = src.microbatch(1, 0)[:, :-1]
    h = torch.randn(*tokens.shape, spec.d_model, dtype=torch.float64)
    a = enc.proj.A[tokens]
    rebuilt = dec(enc(h, tokens), tokens)
    assert torch.allclose(rebuilt, a + (h - a) @ U @ U.T, atol=1e-12)  # the projection of h - A[tok], plus A[tok]
    with pytest.raises(ValueError, match="dense run"):
        learned_boundaries(InProcessPipeline(spec.with_codec("subspace"), serialize=False), "learned")
    with pytest.raises(ValueError, match="unknown learned boundary"):
        learned_boundaries(InProcessPipeline(spec, serialize=False), "learnt")


def test_fidelity_jobs_train_each_learned_variant():
    """The bench's jobs (bf16 wire, the smoke shape): each variant trains, reports the compression of its width,
    and freezes or drops what its name says."""
    base = dense(plan_shape("smoke").base)
    for variant in LEARNED_BOUNDARIES:
        job = Job(variant, "learned", base, boundary=variant)
        res = train_job(job, None, eval_every=4, eval_batches=2, log=lambda *_: None)
        assert res.steps == base.total_steps and math.isfinite(res.final_val) and not res.error
        assert res.compression == pytest.approx(base.d_model / base.rank)
    pipe = InProcessPipeline(base, serialize=False)
    learned_boundaries(pipe, "learned-fixedu")
    proj = pipe.runners[0].module.encoder.proj
    assert not proj.W.requires_grad and proj.A is not None
    learned_boundaries(pipe, "learned-noanchor")
    assert pipe.runners[0].module.encoder.proj.A is None
    slow = base.replace(constrained_stage_lr_scale=0.03)
    pipe = InProcessPipeline(slow, serialize=False)
    learned_boundaries(pipe, "learned-projlr1")
    proj, opt = pipe.runners[0].module.encoder.proj, pipe.runners[0].optimizer
    [own] = [g for g in opt.param_groups if any(p is proj.W for p in g["params"])]
    assert "lr_scale" not in own and own["weight_decay"] == 0.0 and any(p is proj.A for p in own["params"])
    assert all(g.get("lr_scale") == 0.03 for g in opt.param_groups if g is not own)
