"""The subspace-preserving AdamW and the schedule (docs/algorithms.md 1.5; section 3 test 6)."""
from __future__ import annotations

import math

import pytest
import torch

from protocol.model import build_stage
from protocol.optim import SubspaceAdamW, lr_at, make_optimizer
from protocol.spec import preset
from protocol.subspace import make_basis, out_of_subspace, project_cols, project_rows

F64 = torch.float64


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=16, n_layers=2, stages=2, batch_size=4,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64", weight_decay=0.1, lr=1e-2)
    base.update(kw)
    return preset("tiny", **base)


def drift(module):
    U = module.embed.U
    return max(out_of_subspace(w.detach(), U, rows=rows) for _, w, rows in module.constrained_weights())


def random_steps(module, opt, steps=50, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in module.parameters():
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype) * scale
        opt.step()
        opt.zero_grad(set_to_none=True)


def moved(module, fresh):
    return min(float((w.detach() - w0.detach()).norm() / w0.detach().norm())
               for (_, w, _), (_, w0, _) in zip(module.constrained_weights(), fresh.constrained_weights()))


def test_subspace_adamw_keeps_col_and_row_constraints():
    spec = small()
    m, fresh = build_stage(spec, 0), build_stage(spec, 0)
    kinds = sorted({k for _, _, k in m.constrained_parameters()})
    assert kinds == ["col", "row"]
    opt = make_optimizer(spec, m)
    assert opt.v_scale == spec.d_model / spec.rank
    assert sorted(g["constraint"] or "" for g in opt.param_groups) == ["", "", "col", "row"]
    assert drift(m) < 1e-14
    random_steps(m, opt)
    assert drift(m) < 1e-12
    assert moved(m, fresh) > 0.1  # the weights really trained


def test_plain_adamw_drifts_negative_control():
    spec = small()
    m = build_stage(spec, 0)
    opt = torch.optim.AdamW(m.parameters(), lr=spec.lr, weight_decay=spec.weight_decay)
    random_steps(m, opt)
    assert drift(m) > 1e-3


def test_reparam_stays_exact_under_any_optimizer():
    spec = small(subspace_mode="reparam")
    m, fresh = build_stage(spec, 0), build_stage(spec, 0)
    assert m.constrained_parameters() == []
    random_steps(m, torch.optim.AdamW(m.parameters(), lr=spec.lr, weight_decay=spec.weight_decay))
    assert drift(m) < 1e-12
    assert moved(m, fresh) > 0.1
    m2 = build_stage(spec, 0)
    random_steps(m2, make_optimizer(spec, m2))
    assert drift(m2) < 1e-12


def test_fp32_drift_stays_small():
    spec = small(dtype="fp32", wire_dtype="fp32")
    m = build_stage(spec, 0)
    random_steps(m, make_optimizer(spec, m))
    assert drift(m) < 1e-5


@pytest.mark.parametrize("kind", ["col", "row"])
@pytest.mark.parametrize("v_scale", [1.0, 8.0])
def test_subspace_adamw_update_formula(kind, v_scale):
    """Two steps against docs/algorithms.md 1.5a written out by hand, one adaptive rate per column (row)."""
    d, n, k, lr, (b1, b2), eps, wd = 16, 6, 3, 0.05, (0.9, 0.95), 1e-8, 0.1
    U = make_basis(d, k, 2, seed=2, dtype=F64).U
    g = torch.Generator().manual_seed(5)
    shape = (d, n) if kind == "col" else (n, d)
    proj = (lambda X: project_cols(X, U)) if kind == "col" else (lambda X: project_rows(X, U))
    W = proj(torch.randn(shape, generator=g, dtype=F64))
    p = torch.nn.Parameter(W.clone())
    opt = SubspaceAdamW([dict(params=[p], constraint=kind)], U, lr, (b1, b2), eps, wd, v_scale)
    m = torch.zeros(shape, dtype=F64)
    v = torch.zeros((1, n) if kind == "col" else (n, 1), dtype=F64)
    for t in (1, 2):
        G = torch.randn(shape, generator=g, dtype=F64)
        p.grad = G.clone()
        opt.step()
        Gt = proj(G)
        m = b1 * m + (1 - b1) * Gt
        v = b2 * v + (1 - b2) * v_scale * Gt.pow(2).mean(dim=0 if kind == "col" else 1, keepdim=True)
        W = W * (1 - lr * wd) - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)
        assert torch.allclose(p.detach(), W, rtol=0, atol=1e-14)
    assert opt.state[p]["exp_avg_sq"].shape == v.shape


def test_unconstrained_groups_are_plain_adamw():
    g = torch.Generator().manual_seed(0)
    a = torch.nn.Parameter(torch.randn(5, 4, generator=g, dtype=F64))
    b = torch.nn.Parameter(a.detach().clone())
    ours = SubspaceAdamW([dict(params=[a])], None, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    ref = torch.optim.AdamW([b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for _ in range(5):
        G = torch.randn(5, 4, generator=g, dtype=F64)
        a.grad, b.grad = G.clone(), G.clone()
        ours.step()
        ref.step()
    assert torch.allclose(a, b, rtol=0, atol=1e-14)


def test_make_optimizer_groups():
    spec = small()
    m = build_stage(spec, 0)
    opt = make_optimizer(spec, m)
    seen = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(seen) == sorted(id(p) for p in m.parameters())  # each parameter exactly once
    for g in opt.param_groups:
        if g["constraint"] is None and all(p.ndim == 1 for p in g["params"]):
            assert g["weight_decay"] == 0.0  # norm gains are not decayed
    assert opt.U is m.embed.U
    assert make_optimizer(small(v_scale_by_rank=False), build_stage(small(v_scale_by_rank=False), 0)).v_scale == 1.0
    assert make_optimizer(small(codec="dense"), build_stage(small(codec="dense"), 0)).v_scale == 1.0


def test_set_basis_maps_first_moments():
    spec = small()
    m = build_stage(spec, 0)
    opt = make_optimizer(spec, m)
    random_steps(m, opt, steps=3)
    U_new = make_basis(spec.d_model, spec.rank, 2, seed=99, dtype=F64).U
    opt.set_basis(U_new)
    assert opt.U is U_new
    for _, p, kind in m.constrained_parameters():
        assert out_of_subspace(opt.state[p]["exp_avg"], U_new, rows=kind == "row") < 1e-12


def test_lr_schedule():
    s = small(lr=1e-3, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
    assert lr_at(s, 0) == pytest.approx(1e-4)
    assert lr_at(s, 4) == pytest.approx(5e-4)
    assert lr_at(s, 9) == pytest.approx(1e-3)
    assert lr_at(s, 10) == pytest.approx(1e-3)
    assert lr_at(s, 60) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # cosine midpoint
    assert lr_at(s, 35) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))))
    assert lr_at(s, 110) == pytest.approx(1e-4)
    assert lr_at(s, 1000) == pytest.approx(1e-4)
    lrs = [lr_at(s, t) for t in range(120)]
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))
    const = small(lr=2e-3, warmup_steps=0, total_steps=0)
    assert {lr_at(const, t) for t in (0, 5, 10_000)} == {2e-3}
    warm_only = small(lr=2e-3, warmup_steps=4, total_steps=0)
    assert [lr_at(warm_only, t) for t in range(6)] == pytest.approx([5e-4, 1e-3, 1.5e-3, 2e-3, 2e-3, 2e-3])
