"""StageRunner: refusals, checkpoint resume, and the basis switch (docs/algorithms.md 1.7; section 3 test 10)."""
from __future__ import annotations

import pytest
import torch

from peer.runner.pipeline import InProcessPipeline
from peer.runner.stage import StageError, StageRunner
from protocol.model import spec_basis
from protocol.reference import ReferenceModel
from protocol.spec import preset
from protocol.subspace import SubspaceBasis, grassmann_step, out_of_subspace, principal_angles

F64 = torch.float64



def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=16, n_layers=2, stages=2, batch_size=8,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64", lr=1e-3)
    base.update(kw)
    return preset("tiny", **base)


def batch(step, mb, spec=None):
    g = torch.Generator().manual_seed(1000 * step + mb)
    return torch.randint(0, 256, (4, 17), generator=g)


@pytest.fixture
def pair():
    spec = small()
    basis = spec_basis(spec)
    return spec, StageRunner(spec, 0, basis=basis), StageRunner(spec, 1, basis=basis)


def run_microbatch(head, tail, step, mb):
    z = head.forward(step, mb, batch(step, mb))
    loss, g = tail.forward_backward(step, mb, batch(step, mb), z)
    head.backward(step, mb, g)
    return loss


def test_refusals(pair):
    spec, head, tail = pair
    tok = batch(0, 0)
    with pytest.raises(StageError, match="step"):
        head.forward(1, 0, tok)  # wrong step
    with pytest.raises(StageError):
        head.forward(0, spec.n_microbatches, tok)  # microbatch out of range
    with pytest.raises(StageError):
        head.forward(0, -1, tok)
    with pytest.raises(StageError, match="holds 4 sequences, not 3"):
        head.forward(0, 0, tok[:3])  # fewer sequences would weigh each token more than 1 / (n B T)
    z = head.forward(0, 0, tok)
    with pytest.raises(StageError, match="already"):
        head.forward(0, 0, tok)  # duplicate microbatch
    with pytest.raises(StageError):
        head.forward_backward(0, 1, tok, None)  # only the last stage computes the loss
    with pytest.raises(StageError):
        tail.forward(0, 0, tok, z)  # the last stage runs forward_backward
    with pytest.raises(StageError):
        tail.forward_backward(0, 0, tok, None)  # a non-first stage needs a boundary tensor
    with pytest.raises(StageError, match="holds 4 sequences, not 2"):
        tail.forward_backward(0, 0, tok[:2], z[:2])
    loss, g = tail.forward_backward(0, 0, tok, z)
    with pytest.raises(StageError, match="already"):
        tail.forward_backward(0, 0, tok, z)  # duplicate on the last stage
    with pytest.raises(StageError, match="no forward"):
        head.backward(0, 1, g)  # unknown microbatch
    with pytest.raises(StageError, match="step"):
        head.backward(1, 0, g)  # wrong step
    with pytest.raises(StageError, match="shape"):
        head.backward(0, 0, g[:, :, :-1])
    with pytest.raises(StageError, match="microbatches"):
        head.optimizer_step()  # microbatch 0 not through backward yet
    head.backward(0, 0, g)
    with pytest.raises(StageError, match="no forward"):
        head.backward(0, 0, g)  # twice
    with pytest.raises(StageError, match="microbatches"):
        head.optimizer_step()  # 1 of 2
    with pytest.raises(StageError, match="microbatches"):
        tail.optimizer_step()
    run_microbatch(head, tail, 0, 1)
    rec = head.optimizer_step()
    assert rec.step == 0 and head.step == 1 and rec.grad_norm > 0
    with pytest.raises(StageError, match="step"):
        head.forward(0, 0, tok)  # the old step is over
    assert tail.optimizer_step().step == 0


def test_abort_and_drop_stale(pair):
    spec, head, tail = pair
    head.forward(0, 0, batch(0, 0))
    head.forward(0, 1, batch(0, 1))
    assert head.drop_stale(3600.0) == 0
    assert head.drop_stale(-1.0) == 2
    with pytest.raises(StageError):
        head.backward(0, 0, torch.zeros(4, 16, 8, dtype=F64))
    run_microbatch(head, tail, 0, 0)
    head.abort_step()
    assert not head.step_ready() and all(p.grad is None for p in head.module.parameters())
    head.forward(0, 0, batch(0, 0))  # the microbatch may be sent again after an abort


def state_of(pipe):
    return [[p.detach().clone() for p in r.module.parameters()] for r in pipe.runners]


@pytest.mark.parametrize("mode", ["project", "reparam"])
def test_checkpoint_resume_continues_identically(tmp_path, mode):
    spec = small(subspace_mode=mode, stages=2)
    a = InProcessPipeline(spec)
    for step in range(3):
        a.train_step(step, batch)
    for i, r in enumerate(a.runners):
        torch.save(r.state_dict(), tmp_path / f"stage{i}.pt")
    b = InProcessPipeline(spec)
    for i, r in enumerate(b.runners):
        r.load_state_dict(torch.load(tmp_path / f"stage{i}.pt"))  # weights_only: plain data only
        assert r.step == 3
    losses_a = [a.train_step(step, batch).loss for step in range(3, 6)]
    losses_b = [b.train_step(step, batch).loss for step in range(3, 6)]
    assert losses_a == losses_b
    for xs, ys in zip(state_of(a), state_of(b)):
        assert all(torch.equal(x, y) for x, y in zip(xs, ys))
    # a fresh pipeline that did not resume is somewhere else
    c = InProcessPipeline(spec)
    assert [c.train_step(step, batch).loss for step in range(3)] != losses_a


def test_checkpoint_resume_across_basis_refits(tmp_path):
    """A checkpoint taken after a re-fit carries U and the statistic: the resumed pipeline takes
    the next re-fit and switch exactly as the original does."""
    spec = small(stages=3, n_layers=3, basis_interval=4, basis_switch_delay=2)
    a = InProcessPipeline(spec)
    for step in range(7):  # version 1 took effect at step 6
        a.train_step(step, batch)
    assert a.runners[0].basis_version == 1
    for i, r in enumerate(a.runners):
        torch.save(r.state_dict(), tmp_path / f"stage{i}.pt")
    b = InProcessPipeline(spec)
    for i, r in enumerate(b.runners):
        r.load_state_dict(torch.load(tmp_path / f"stage{i}.pt"))
        assert r.basis_version == 1 and torch.equal(r.basis.U, a.runners[i].basis.U)
    losses_a = [a.train_step(step, batch).loss for step in range(7, 12)]
    losses_b = [b.train_step(step, batch).loss for step in range(7, 12)]
    assert losses_a == losses_b
    assert b.runners[0].basis_version == 2 and torch.equal(a.runners[0].basis.U, b.runners[0].basis.U)
    for xs, ys in zip(state_of(a), state_of(b)):
        assert all(torch.equal(x, y) for x, y in zip(xs, ys))


def test_checkpoint_of_another_stage_or_run_refused(tmp_path):
    spec = small()
    state = StageRunner(spec, 0).state_dict()
    with pytest.raises(StageError):
        StageRunner(spec, 1).load_state_dict(state)
    with pytest.raises(StageError):
        StageRunner(spec.replace(lr=2e-3), 0).load_state_dict(state)


def new_basis(old: SubspaceBasis, seed=12345, cap=0.05) -> SubspaceBasis:
    g = torch.Generator().manual_seed(seed)
    M = torch.randn(old.U.shape, generator=g, dtype=F64)
    U = grassmann_step(old.U, M, eta=1.0, max_angle=cap)
    assert 1e-3 < float(principal_angles(old.U, U).max()) <= cap + 1e-12
    return SubspaceBasis(U, old.T_fixed, old.version + 1)


@pytest.mark.parametrize("mode", ["project", "reparam"])
def test_switch_basis(mode):
    spec = small(subspace_mode=mode, stages=3, n_layers=3)
    old = spec_basis(spec)
    pipe, ref = InProcessPipeline(spec, basis=old), ReferenceModel(spec, basis=old)
    for step in range(3):
        assert pipe.train_step(step, batch).loss == ref.train_step(batch)
    new = new_basis(old)
    before = [[w.detach().clone() for _, w, _ in r.module.constrained_weights()] for r in pipe.runners]
    energies = pipe.switch_basis(new)
    ref.switch_basis(new)
    P = new.U @ new.U.T
    for r, ws, e in zip(pipe.runners, before, energies):
        assert r.basis_version == 1
        if not ws:  # the last stage has nothing to truncate
            assert e == 0.0
            continue
        trunc = sum(float((W - W @ P if rows else W - P @ W).pow(2).sum())
                    for (_, _, rows), W in zip(r.module.constrained_weights(), ws))
        expected = (trunc / sum(float(W.pow(2).sum()) for W in ws)) ** 0.5
        assert e == pytest.approx(expected, rel=1e-10)
        assert 1e-4 < e < 0.2
        for name, w, rows in r.module.constrained_weights():
            assert out_of_subspace(w.detach(), new.U, rows=rows) < 1e-12, name
            assert out_of_subspace(w.detach(), old.U, rows=rows) > 1e-4, name
        for _, p, kind in r.module.constrained_parameters():
            assert out_of_subspace(r.optimizer.state[p]["exp_avg"], new.U, rows=kind == "row") < 1e-12
    # training goes on in the new subspace, messages carry version 1, and the pipeline still
    # equals the one-process reference that made the same switch
    for step in range(3, 6):
        assert pipe.train_step(step, batch).loss == ref.train_step(batch)
    for r, m in zip(pipe.runners, ref.stages):
        assert all(torch.equal(x, y) for x, y in zip(r.module.parameters(), m.parameters()))
        for name, w, rows in r.module.constrained_weights():
            assert out_of_subspace(w.detach(), new.U, rows=rows) < 1e-12, name
    # boundary activations minus T_fixed[tok] now lie in the new subspace, and decode exactly
    tok = batch(9, 0)[:, :-1]
    with torch.no_grad():
        h = pipe.runners[0].module.body(pipe.runners[0].module.enter(tok, None))
        z = pipe.runners[0].module.leave(h, tok)
        assert out_of_subspace((h - new.T_fixed[tok]).reshape(-1, spec.d_model), new.U, rows=True) < 1e-12
        assert out_of_subspace((h - new.T_fixed[tok]).reshape(-1, spec.d_model), old.U, rows=True) > 1e-4
        assert float((pipe.runners[1].module.enter(tok, z) - h).norm() / h.norm()) < 1e-12


def test_scheduled_refits_in_pipeline():
    """Re-fits every 4 steps, effective 2 steps later: every stage switches together to the same
    orthonormal U, each move within the angle cap, weights stay in the live subspace."""
    spec = small(stages=3, n_layers=3, basis_interval=4, basis_switch_delay=2)
    pipe = InProcessPipeline(spec)
    bases = [pipe.runners[0].basis.U.clone()]
    for step in range(13):
        assert pipe.train_step(step, batch).loss < 6
        U = pipe.runners[0].basis.U
        if not torch.equal(U, bases[-1]):
            bases.append(U.clone())
        versions = {r.basis_version for r in pipe.runners}
        assert len(versions) == 1
        for r in pipe.runners:
            assert torch.equal(r.basis.U, U)
            for name, w, rows in r.module.constrained_weights():
                assert out_of_subspace(w, U, rows=rows) < 1e-12, (step, name)
    assert pipe.basis_log == [(1, 6), (2, 10), (3, 14)]
    assert len(bases) == 3 and pipe.runners[0].basis_version == 2
    for old, new in zip(bases, bases[1:]):
        assert float((new.T @ new - torch.eye(spec.rank, dtype=F64)).abs().max()) < 1e-12
        assert 1e-4 < float(principal_angles(old, new).max()) <= spec.grassmann_max_angle + 1e-12
    assert all(0 < r.last_truncation < 0.2 for r in pipe.runners[:-1])


def test_basis_update_rules():
    """Which basis update a stage takes: the next version, for a step it has not started; each
    refusal names its rule and changes nothing."""
    spec = preset("tiny", stages=2, basis_interval=5)
    runner = StageRunner(spec, 1)
    U = grassmann_step(spec_basis(spec).U.double(), torch.randn(spec.d_model, spec.rank, dtype=F64), 0.05).float()
    tokens = torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1))
    runner.forward_backward(0, 0, tokens, torch.randn(spec.microbatch_size, spec.seq_len, spec.rank))  # step 0 began
    with pytest.raises(StageError, match="already started"):
        runner.schedule_basis(U, 1, 0)
    with pytest.raises(StageError, match="not the next"):
        runner.schedule_basis(U, 2, 5)
    assert runner.scheduled is None and runner.basis_version == 0
    runner.schedule_basis(U, 1, 5)
    assert runner.scheduled == (1, 5)
    with pytest.raises(StageError, match="already scheduled"):
        runner.schedule_basis(U, 1, 6)
    assert runner.scheduled == (1, 5)
