"""Gradients through a compressed boundary (docs/algorithms.md 1.4; section 3 test 5).

The compressed model (`boundary=True`: encode to k numbers, decode) and the same weights
chained on the raw hidden state (`boundary=False`) must give: identical gradients for every
unconstrained parameter; different raw but identical *projected* gradients (P G for W_o,
W_down; G P for T_S) for the constrained ones; and an optimizer that only uses the latter.
"""
from __future__ import annotations

import pytest
import torch

from protocol.optim import SubspaceAdamW, clip_grad_norm
from protocol.reference import ReferenceModel
from protocol.spec import preset
from protocol.subspace import make_basis, out_of_subspace, project_cols, project_rows

F64 = torch.float64


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=32, n_layers=4, stages=2, batch_size=8,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64")
    base.update(kw)
    return preset("tiny", **base)


def batch(spec, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.vocab, (4, spec.seq_len + 1), generator=g)


def rel(a, b):
    return float((a - b).norm() / b.norm())


def grads_both_ways(spec):
    tok = batch(spec)
    comp, dense = ReferenceModel(spec, boundary=True), ReferenceModel(spec, boundary=False)
    for a, b in zip(comp.stages, dense.stages):  # identical init, by construction
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    lc, ld = comp.loss(tok), dense.loss(tok)
    assert float(lc.detach()) == pytest.approx(float(ld.detach()), rel=1e-13)
    lc.backward()
    ld.backward()
    return comp, dense


def projector(kind, U):
    return (lambda G: project_cols(G, U)) if kind == "col" else (lambda G: project_rows(G, U))


@pytest.mark.parametrize("stages,layers", [(2, 4), (3, 3)])
def test_unconstrained_equal_projected_equal(stages, layers):
    spec = small(stages=stages, n_layers=layers)
    comp, dense = grads_both_ways(spec)
    U = comp.optimizers[0].U
    n_unc = n_con = 0
    for a, b in zip(comp.stages, dense.stages):
        kinds = {n: k for n, _, k in a.constrained_parameters()}
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert float(q.grad.norm()) > 0, name
            kind = kinds.get(name)
            if kind is None:
                n_unc += 1
                assert rel(p.grad, q.grad) < 1e-12, name
            else:
                n_con += 1
                P = projector(kind, U)
                assert rel(P(p.grad), P(q.grad)) < 1e-12, name
                # the raw gradients differ by the out-of-S part of the dense one (most of it)
                assert rel(p.grad, q.grad) > 0.1, name
                assert out_of_subspace(q.grad, U, rows=kind == "row") > 0.5, name
    # wq, wk, wv, w_gate, w_up, 2 norms per layer, final norm and head, and the free W_o,
    # W_down of the last stage; W_o, W_down per constrained layer plus T_S
    assert n_unc == 7 * layers + 2 + 2 * spec.stage_layers[-1]
    assert n_con == 2 * (layers - spec.stage_layers[-1]) + 1


def test_compressed_gradient_of_the_layer_feeding_the_boundary_is_already_projected():
    """dL/dz = g U backpropagates P g into the stage: the W_down right before the boundary sees
    exactly P g, so its raw gradient is in S; layers further back mix in their own Jacobians."""
    spec = small()
    comp, _ = grads_both_ways(spec)
    U = comp.optimizers[0].U
    s0 = comp.stages[0]
    assert out_of_subspace(s0.blocks[-1].w_down.weight.grad, U) < 1e-12
    assert out_of_subspace(s0.blocks[0].wo.weight.grad, U) > 1e-2
    assert out_of_subspace(s0.embed.weight.grad, U, rows=True) > 1e-2


def test_reparam_every_gradient_equal():
    """With W = U A the chain rule projects for us: dL/dA = U^T dL/dW is the same both ways."""
    comp, dense = grads_both_ways(small(subspace_mode="reparam"))
    for a, b in zip(comp.stages, dense.stages):
        assert a.constrained_parameters() == []
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert rel(p.grad, q.grad) < 1e-12, name
    assert comp.stages[0].blocks[0].wo.A.shape == (8, 64)


@pytest.mark.parametrize("kind", ["col", "row"])
def test_optimizer_consumes_only_projected_gradients(kind):
    d, n, k = 32, 24, 4
    U = make_basis(d, k, 2, seed=0, dtype=F64).U
    g = torch.Generator().manual_seed(1)
    P = projector(kind, U)
    W0 = torch.randn(d, n, generator=g, dtype=F64) if kind == "col" else torch.randn(n, d, generator=g, dtype=F64)
    W0 = P(W0)
    raw_p = torch.nn.Parameter(W0.clone())
    proj_p = torch.nn.Parameter(W0.clone())
    opts = [SubspaceAdamW([dict(params=[p], constraint=kind)], U, lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                          weight_decay=0.1, v_scale=d / k) for p in (raw_p, proj_p)]
    for _ in range(10):
        G = torch.randn(W0.shape, generator=g, dtype=F64) * 5  # mostly outside S
        assert out_of_subspace(G, U, rows=kind == "row") > 0.5
        raw_p.grad, proj_p.grad = G.clone(), P(G)
        for o in opts:
            o.step()
    assert rel(raw_p.detach(), proj_p.detach()) < 1e-13
    assert rel(raw_p.detach(), W0) > 1e-2  # it did move
    assert out_of_subspace(raw_p.detach(), U, rows=kind == "row") < 1e-13


def test_clip_norm_sees_projected_gradients():
    U = make_basis(16, 2, 2, seed=0, dtype=F64).U
    W = torch.nn.Parameter(project_cols(torch.randn(16, 8, dtype=F64), U))
    b = torch.nn.Parameter(torch.randn(5, dtype=F64))
    G, gb = torch.randn(16, 8, dtype=F64), torch.randn(5, dtype=F64)
    proj = lambda p, g: project_cols(g, U) if p is W else g  # noqa: E731
    expected = float((project_cols(G, U).pow(2).sum() + gb.pow(2).sum()).sqrt())
    W.grad, b.grad = G.clone(), gb.clone()
    assert clip_grad_norm([W, b], 0.0, proj) == pytest.approx(expected, rel=1e-14)
    assert torch.equal(W.grad, G)  # max_norm 0 disables clipping
    norm = clip_grad_norm([W, b], expected / 4, proj)
    assert norm == pytest.approx(expected, rel=1e-14)
    assert torch.allclose(b.grad, gb / 4, rtol=1e-5)  # scaled by max_norm / (norm + 1e-6)
    W.grad, b.grad = G.clone(), gb.clone()
    assert clip_grad_norm([W, b], 1e9, proj) == pytest.approx(expected, rel=1e-14)
    assert torch.equal(W.grad, G)


@pytest.mark.parametrize("mode", ["project", "reparam"])
def test_one_training_step_same_weights(mode):
    """End to end: compressed and uncompressed steps (clip, AdamW) land on the same weights."""
    spec = small(subspace_mode=mode, n_layers=2)
    comp, dense = ReferenceModel(spec, boundary=True), ReferenceModel(spec, boundary=False)
    fn = lambda step, mb: batch(spec, seed=100 * step + mb)  # noqa: E731
    for _ in range(3):
        assert comp.train_step(fn) == pytest.approx(dense.train_step(fn), rel=1e-13)
    for a, b in zip(comp.stages, dense.stages):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert rel(p.detach(), q.detach()) < 1e-12, name
