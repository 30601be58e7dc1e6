"""The re-fit statistics a receiving stage keeps (RunSpec.refit_statistic, docs/algorithms.md 1.7),
each against an independent computation in the one-process reference, and the per-stage token
tables (RunSpec.embed_split "per_stage", docs/fidelity.md) keeping every boundary exact."""
from __future__ import annotations

import pytest
import torch

from peer.runner.pipeline import InProcessPipeline
from protocol.model import build_stage, spec_basis
from protocol.reference import ReferenceModel
from protocol.spec import RunSpec, SpecError, preset
from protocol.subspace import out_of_subspace, principal_angles

F64 = torch.float64


def small(**kw):
    base = dict(d_model=32, n_heads=4, d_ff=64, seq_len=16, n_layers=2, stages=2, batch_size=8,
                microbatch_size=4, rank=4, dtype="fp64", wire_dtype="fp64", lr=1e-3, basis_interval=4,
                basis_switch_delay=2)
    base.update(kw)
    return preset("tiny", **base)


def batch(step, mb):
    g = torch.Generator().manual_seed(1000 * step + mb)
    return torch.randint(0, 256, (4, 17), generator=g)


def first_step_stat(spec: RunSpec) -> torch.Tensor:
    """The receiving stage's statistic after one step, undone of its EMA: the step's own M_s."""
    pipe = InProcessPipeline(spec)
    pipe.train_step(0, batch)
    return pipe.runners[1].stat / (1 - spec.stats_decay)


def test_riemannian_statistic_is_minus_the_loss_gradient_wrt_the_decoders_U():
    """M_s = -dL/dU of h = z U^T + T_fixed[tok], with L the mean over microbatches of their losses,
    scaled by 1 / (n_microbatches * tokens): here U is a leaf and autograd computes the gradient."""
    spec = small(refit_statistic="riemannian")
    M = first_step_stat(spec)
    ref = ReferenceModel(spec)
    dec = ref.stages[1].decoder
    U = dec.U.clone().requires_grad_(True)
    dec.U = U
    n = spec.n_microbatches
    for mb in range(n):
        (ref.loss(batch(0, mb)) / n).backward()
    tokens = spec.microbatch_size * spec.seq_len
    expected = -U.grad / (n * tokens)
    assert float((M - expected).norm() / expected.norm()) < 1e-12
    # its horizontal part is a descent direction: moving U along it lowers this batch's loss
    D = M - U.detach() @ (U.detach().T @ M)
    with torch.no_grad():
        before = sum(float(ref.loss(batch(0, mb))) for mb in range(n))
        dec.U = U.detach() + 1e-3 * D / D.norm()
        after = sum(float(ref.loss(batch(0, mb))) for mb in range(n))
    assert after < before


def test_act_cov_statistic_is_the_covariance_of_the_stages_writes():
    """M_s = mean_tokens Delta Delta^T U with Delta = the stage's residual output minus its input."""
    spec = small(refit_statistic="act_cov")
    M = first_step_stat(spec)
    ref = ReferenceModel(spec)
    head, tail = ref.stages
    U = spec_basis(spec).U
    expected = torch.zeros_like(M)
    with torch.no_grad():
        for mb in range(spec.n_microbatches):
            tok = batch(0, mb)[:, :-1]
            h = tail.enter(tok, head(tok))
            delta = (tail.body(h) - h).reshape(-1, spec.d_model)
            expected += delta.T @ (delta @ U) / (delta.shape[0] * spec.n_microbatches)
    assert float((M - expected).norm() / expected.norm()) < 1e-12


def test_grad_cov_statistic_unchanged():
    """The default statistic is still C_s U with C_s the mean of g g^T over tokens (g = dL/dh_in as
    backward leaves it, i.e. already divided by the number of microbatches)."""
    spec = small()
    M = first_step_stat(spec)
    ref = ReferenceModel(spec)
    U = spec_basis(spec).U
    n = spec.n_microbatches
    expected = torch.zeros_like(M)
    for mb in range(n):
        head, tail = ref.stages
        tok = batch(0, mb)[:, :-1]
        h = tail.enter(tok, head(tok).detach().requires_grad_(True))
        h.retain_grad()
        (torch.nn.functional.cross_entropy(tail.leave(tail.body(h), tok).reshape(-1, spec.vocab),
                                           batch(0, mb)[:, 1:].reshape(-1)) / n).backward()
        g = h.grad.reshape(-1, spec.d_model)
        expected += g.T @ (g @ U) / (g.shape[0] * n)
    assert float((M - expected).norm() / expected.norm()) < 1e-12


@pytest.mark.parametrize("stat", ["grad_cov", "act_cov", "riemannian"])
def test_every_statistic_moves_U_within_the_cap_and_keeps_the_weights_in_span(stat):
    spec = small(refit_statistic=stat, stages=3, n_layers=3)
    pipe = InProcessPipeline(spec)
    U0 = pipe.runners[0].basis.U.clone()
    for step in range(7):
        pipe.train_step(step, batch)
    U = pipe.runners[0].basis.U
    assert pipe.basis_log == [(1, 6)] and all(r.basis_version == 1 for r in pipe.runners)
    assert 1e-4 < float(principal_angles(U0, U).max()) <= spec.grassmann_max_angle + 1e-12
    for r in pipe.runners:
        for name, w, rows in r.module.constrained_weights():
            assert out_of_subspace(w, U, rows=rows) < 1e-12, name


def test_statistics_differ():
    """The three statistics are three different directions (none silently falls back to another)."""
    Ms = {s: first_step_stat(small(refit_statistic=s)) for s in ("grad_cov", "act_cov", "riemannian")}
    U = spec_basis(small()).U
    dirs = {s: (M - U @ (U.T @ M)) / (M - U @ (U.T @ M)).norm() for s, M in Ms.items()}
    for a in dirs:
        for b in dirs:
            if a < b:
                assert abs(float((dirs[a] * dirs[b]).sum())) < 0.99, (a, b)


def test_per_stage_tables_keep_the_boundary_exact():
    """With trained (non-zero) per-stage tables, what leaves a stage minus T_fixed[tok] is in span(U),
    and the next stage enters with the sender's residual stream, its table swapped for its own."""
    spec = small(embed_split="per_stage", stages=3, n_layers=3)
    pipe = InProcessPipeline(spec)
    for step in range(5):
        pipe.train_step(step, batch)
    mods = [r.module for r in pipe.runners]
    assert all(float(m.token_table.detach().norm()) > 1e-4 for m in mods)
    U, T_fixed = pipe.runners[0].basis.U, pipe.runners[0].basis.T_fixed
    tok = batch(9, 0)[:, :-1]
    with torch.no_grad():
        h0 = mods[0].body(mods[0].enter(tok, None))
        sent = h0 - mods[0].token_table[tok] - T_fixed[tok]
        assert out_of_subspace(sent.reshape(-1, spec.d_model), U, rows=True) < 1e-12
        # without taking the table off, the stream would not fit the subspace: the table is really outside
        assert out_of_subspace((h0 - T_fixed[tok]).reshape(-1, spec.d_model), U, rows=True) > 1e-3
        h1 = mods[1].enter(tok, mods[0].leave(h0, tok))
        expected = h0 - mods[0].token_table[tok] + mods[1].token_table[tok]
        assert float((h1 - expected).norm() / expected.norm()) < 1e-12


def test_embed_split_needs_the_subspace_codec():
    with pytest.raises(SpecError, match="embed_split"):
        small(codec="dense", embed_split="per_stage")
    with pytest.raises(SpecError, match="refit_statistic"):
        small(refit_statistic="hessian")


def test_per_stage_tables_exact_under_bf16_compute():
    """bf16 autocast in the blocks: with random tables, each boundary still rebuilds the sender's stream
    (its table swapped for the receiver's) to fp32 rounding through an fp32 wire."""
    spec = small(embed_split="per_stage", stages=3, n_layers=3, dtype="bf16", wire_dtype="fp32", d_model=64,
                 rank=8)
    basis = spec_basis(spec)
    stages = [build_stage(spec, s, basis) for s in range(spec.n_stages)]
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for m in stages:
            m.token_table.copy_(0.05 * torch.randn(m.token_table.shape, generator=g))
    tok, z = batch(0, 0)[:, :-1], None
    with torch.no_grad():
        for s in range(spec.n_stages - 1):
            h = stages[s].body(stages[s].enter(tok, z))
            z = stages[s].leave(h, tok)
            moved = h - stages[s].token_table[tok] - basis.T_fixed[tok]
            assert out_of_subspace(moved.reshape(-1, spec.d_model), basis.U, rows=True) < 1e-6
            rebuilt = stages[s + 1].enter(tok, z)
            expected = h - stages[s].token_table[tok] + stages[s + 1].token_table[tok]
            assert float((rebuilt - expected).norm() / expected.norm()) < 1e-6
