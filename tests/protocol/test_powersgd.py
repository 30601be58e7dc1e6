"""The replica-sync math (docs/algorithms.md 5): the subspace layout loses nothing the optimizer
uses, and PowerSGD over replicas conserves every gradient (applied now or kept as error),
recovers low-rank sums exactly, tracks a steady gradient, and maps its state across a basis
change; `on_device` moves a round's tensors in one copy."""
from __future__ import annotations

import pytest
import torch

from protocol.model import build_stage, spec_basis
from protocol.powersgd import (
    PowerPlan,
    PowerState,
    cat_factors,
    finish,
    first_round,
    on_device,
    orthonormal_factors,
    second_round,
)
from protocol.spec import preset
from protocol.subspace import make_basis, orthonormalize, project_cols, project_rows
from protocol.sync_layout import SyncLayout

D = torch.float64


def _layout(shapes: list[tuple[tuple[int, int], str | None]], k: int = 4) -> SyncLayout:
    return SyncLayout(shapes, k)


def test_the_layout_carries_constrained_gradients_in_subspace_coordinates_and_rebuilds_what_the_optimizer_uses():
    spec = preset("tiny", stages=2, codec="subspace", dtype="fp64", wire_dtype="fp64")
    basis = spec_basis(spec)
    module = build_stage(spec, 0, basis)
    layout = SyncLayout.for_module(module, spec.rank)
    kinds = {id(p): k for _, p, k in module.constrained_parameters()}
    params = [p for p in module.parameters() if p.requires_grad]
    grads = [torch.randn(p.shape, dtype=D) for p in params]
    flat = layout.pack(grads, basis.U)
    assert flat.numel() == layout.numel < layout.full_numel == sum(p.numel() for p in params)
    assert {e.kind for e in layout.entries} == {None, "col", "row"}
    for p, g, back in zip(params, grads, layout.unpack(flat, basis.U)):
        kind = kinds.get(id(p))
        want = project_cols(g, basis.U) if kind == "col" else project_rows(g, basis.U) if kind == "row" else g
        assert back.shape == p.shape
        assert torch.allclose(back, want, atol=1e-12), kind


def _replicas(n: int, layout: SyncLayout, plan: PowerPlan, seed: int = 3) -> list[PowerState]:
    return [PowerState.initial(layout, plan, seed, D) for _ in range(n)]


def _reduce(layout, plan, states, flats, factor_dtype=D):
    """What StepCommit does, without the network: two rounds, sums in one order."""
    firsts = [first_round(layout, plan, s, f, factor_dtype) for s, f in zip(states, flats)]
    exact = sum(f.exact for f in firsts)
    P_sum = sum(f.P.to(D) for f in firsts)
    P_hat = orthonormal_factors(layout, plan, P_sum, D)
    Qs = [second_round(f.M, P_hat, factor_dtype) for f in firsts]
    Q_sum = sum(cat_factors(q, factor_dtype).to(D) for q in Qs)
    outs = [finish(layout, plan, f, exact, P_hat, q, Q_sum, D) for f, q in zip(firsts, Qs)]
    return outs, firsts


def test_powersgd_applies_or_keeps_every_number_and_every_replica_gets_the_same_sum():
    layout = _layout([((40, 30), None), ((30,), None), ((64, 24), "col"), ((3, 3), None)], k=8)
    plan = PowerPlan.for_layout(layout, 2)
    assert plan.compressed == (0, 2) and plan.exact == (1, 3)  # the vector and the 3x3 travel exactly
    states = _replicas(3, layout, plan)
    flats = [torch.randn(layout.numel, dtype=D) for _ in states]
    outs, firsts = _reduce(layout, plan, states, flats)
    applied = outs[0][0]
    assert all(torch.equal(o[0], applied) for o in outs)  # the same bits on every replica
    total = sum(flats)
    kept = [sum(o[1].error[j] for o in outs) for j in range(len(plan.compressed))]
    views, want = layout.views(applied), layout.views(total)
    for j, i in enumerate(plan.compressed):
        assert torch.allclose(views[i] + kept[j], want[i], atol=1e-12)  # conservation
        assert torch.linalg.matrix_rank(views[i]) <= plan.rank
    for i in plan.exact:
        assert torch.allclose(views[i], want[i], atol=1e-12)


def test_powersgd_recovers_a_sum_of_rank_at_most_r_exactly():
    layout = _layout([((50, 40), None)])
    plan = PowerPlan.for_layout(layout, 3)
    states = _replicas(2, layout, plan)
    low = [(torch.randn(50, 2, dtype=D) @ torch.randn(2, 40, dtype=D)) for _ in range(2)]
    low[1] = low[0] * 0.5 + torch.randn(50, 1, dtype=D) @ torch.randn(1, 40, dtype=D)  # the sum has rank 3
    outs, _ = _reduce(layout, plan, states, [m.reshape(-1) for m in low])
    assert torch.allclose(outs[0][0], (low[0] + low[1]).reshape(-1), atol=1e-10)
    assert all(float(e.abs().max()) < 1e-10 for o in outs for e in o[1].error)


def test_error_feedback_delivers_a_steady_full_rank_gradient_on_average():
    layout = _layout([((32, 32), None)])
    plan = PowerPlan.for_layout(layout, 2)
    states = _replicas(2, layout, plan)
    g = [torch.randn(32 * 32, dtype=D) for _ in range(2)]
    applied, steps = torch.zeros(32 * 32, dtype=D), 200
    for _ in range(steps):
        outs, _ = _reduce(layout, plan, states, g)
        applied += outs[0][0]
        states = [o[1] for o in outs]
    target = (g[0] + g[1]) * steps
    # what is not applied yet is the error the replicas keep, bounded: the average converges
    assert float((applied - target).norm() / target.norm()) < 0.1
    assert torch.allclose(applied + sum(s.error[0].reshape(-1) for s in states), target, atol=1e-8)


def test_rounded_factors_are_fed_back_like_the_rest_of_the_error():
    layout = _layout([((48, 40), None)])
    plan = PowerPlan.for_layout(layout, 4)
    states = _replicas(2, layout, plan)
    flats = [torch.randn(layout.numel, dtype=D) for _ in states]
    outs, _ = _reduce(layout, plan, states, flats, factor_dtype=torch.bfloat16)
    assert all(torch.equal(o[0], outs[0][0]) for o in outs)
    assert torch.allclose(outs[0][0] + sum(o[1].error[0].reshape(-1) for o in outs), sum(flats), atol=1e-12)


def test_a_basis_change_maps_error_and_q_to_the_new_coordinates():
    d, k = 64, 8
    U_old = make_basis(d, k, 16, seed=1, dtype=D).U
    U_new = orthonormalize(U_old + 0.05 * torch.randn(d, k, dtype=D))
    layout = _layout([((d, 40), "col"), ((50, d), "row")], k=k)
    plan = PowerPlan.for_layout(layout, 2)
    state = PowerState.initial(layout, plan, 0, D)
    state.error = [torch.randn(k, 40, dtype=D), torch.randn(50, k, dtype=D)]
    full = [U_old @ state.error[0], state.error[1] @ U_old.T]
    q_full = U_old @ state.Q[1]
    state.change_basis(layout, plan, U_new.T @ U_old)
    assert torch.allclose(state.error[0], U_new.T @ full[0], atol=1e-12)
    assert torch.allclose(state.error[1], full[1] @ U_new, atol=1e-12)
    assert torch.allclose(state.Q[1], U_new.T @ q_full, atol=1e-12)


def _mixed() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return [torch.randn(5, 3, generator=g, dtype=torch.float64), torch.randn(7, generator=g).to(torch.bfloat16),
            torch.randn(2, 4, generator=g, dtype=torch.float64), torch.zeros(0, dtype=torch.float32)]


def test_on_device_keeps_tensors_already_there():
    ts = _mixed()
    assert all(a is b for a, b in zip(on_device(ts, "cpu"), ts))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="moving between devices needs a GPU")
def test_on_device_moves_values_dtypes_and_shapes_unchanged_in_one_copy_per_dtype():
    ts = _mixed()
    moved = on_device([*ts, ts[0].cuda()], "cuda:0")
    assert all(m.device.type == "cuda" for m in moved)
    for t, m in zip(ts + [ts[0]], moved):
        assert m.dtype == t.dtype and m.shape == t.shape and torch.equal(m.cpu(), t)
    assert moved[0].untyped_storage().data_ptr() == moved[2].untyped_storage().data_ptr()  # one float64 copy
