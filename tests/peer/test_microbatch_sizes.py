"""A step cut into microbatches of listed sizes (`RunSpec.microbatch_sizes`, protocol/microbatch_split.py):
each microbatch weighs its share of the step's sequences, so a cut changes nothing of what one step
computes; the swarm equals the one-process run with the same cut; a stage refuses a microbatch whose
rows are not its size; a spec without the field keeps its hash; bad cuts fail with what to give."""
from __future__ import annotations

import pytest
import torch

from peer.memory_swarm import batches
from peer.pipeline import InProcessPipeline
from peer.stage import StageError, StageRunner
from protocol.microbatch_split import parse_sizes, step_loss
from protocol.reference import ReferenceModel
from protocol.spec import RunSpec, SpecError, preset
from swarm.cli import build_parser
from swarm.spec_flags import spec_from_args
from tests.peer.swarm_in_memory import make_swarm, patient_options
from tests.peer.test_every_head import assert_equals_the_oracle
from tests.peer.test_replicas import spec_for

CUT = (2, 14, 14, 2)  # small ends, 32 sequences as spec_for's 4 x 8


def cut_of(spec: RunSpec, sizes: tuple[int, ...]) -> RunSpec:
    return spec.replace(microbatch_sizes=sizes, microbatch_size=max(sizes), batch_size=sum(sizes))


def sliced(batch: torch.Tensor, sizes: tuple[int, ...]):
    """The same 32 sequences at every step, cut as `sizes` says."""
    parts = batch.split(list(sizes))
    return lambda step, mb: parts[mb]


@pytest.mark.parametrize("model", ["pipeline", "reference"])
def test_a_cut_changes_nothing_a_step_computes(model):
    """Two steps on one fixed batch: cut 8,8,8,8 and 2,14,14,2 give the same step losses and weights
    (fp64, 1e-12). A cut that weighed each microbatch 1/n would be 3.5x off on the big ones."""
    equal = spec_for("subspace", "fp64")
    data = torch.cat([batches(equal)(0, mb) for mb in range(equal.n_microbatches)])
    runs = []
    for sizes in ((8, 8, 8, 8), CUT):
        spec = cut_of(equal, sizes)
        batch = sliced(data, sizes)
        if model == "pipeline":
            pipe = InProcessPipeline(spec)
            losses = [pipe.train_step(s, batch).loss for s in range(2)]
            params = [p.detach().clone() for r in pipe.runners for p in r.module.parameters()]
        else:
            ref = ReferenceModel(spec)
            losses = [ref.train_step(batch) for _ in range(2)]
            params = [p.detach().clone() for m in ref.stages for p in m.parameters()]
        runs.append((losses, params))
    (l_eq, p_eq), (l_cut, p_cut) = runs
    assert l_cut == pytest.approx(l_eq, rel=1e-12)
    assert len(p_eq) == len(p_cut)
    for a, b in zip(p_eq, p_cut):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    assert step_loss(cut_of(equal, CUT), [1.0, 2.0, 3.0, 4.0]) == pytest.approx((2 + 28 + 42 + 8) / 32)


async def test_two_heads_by_two_with_small_ends_equal_the_oracle(oracle_runs):
    spec = cut_of(spec_for("subspace", "fp64"), CUT)
    swarm = await make_swarm(spec, [2, 2], **patient_options())
    try:
        logs = await swarm.drive(4)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert [log.step for log in logs] == [1, 2, 3, 4]
    assert all(log.tokens == 32 * spec.seq_len for log in logs)
    assert all(min(log.heads.values()) >= 1 for log in logs), [log.heads for log in logs]
    assert_equals_the_oracle(swarm, spec, logs, oracle_runs, 4)


def test_a_stage_refuses_a_microbatch_of_another_size():
    spec = cut_of(spec_for("subspace", "fp64"), CUT)
    first, last = StageRunner(spec, 0), StageRunner(spec, 1)
    data = batches(spec)
    assert data(0, 0).shape[0] == 2 and data(0, 1).shape[0] == 14
    with pytest.raises(StageError, match="microbatch 0 holds 2 sequences, not 14"):
        first.forward(0, 0, data(0, 1))
    z = first.forward(0, 1, data(0, 1))
    with pytest.raises(StageError, match="microbatch 3 holds 2 sequences, not 14"):
        last.forward_backward(0, 3, data(0, 1), z)


def test_the_spec_checks_the_cut_and_keeps_old_hashes():
    plain = preset("small")
    assert "microbatch_sizes" not in plain.to_dict()  # every spec signed before the field keeps its hash
    cut = preset("small", microbatch_sizes=[2, 14, 14, 2])
    assert (cut.batch_size, cut.microbatch_size, cut.n_microbatches) == (32, 14, 4)
    assert cut.run_hash != plain.run_hash and RunSpec.from_json(cut.to_json()) == cut
    with pytest.raises(SpecError, match="add up to 32"):
        preset("small", microbatch_sizes=[2, 14, 14, 2], batch_size=64)
    with pytest.raises(SpecError, match="must add up to batch_size"):
        plain.replace(microbatch_sizes=(2, 14, 14, 1), microbatch_size=14)
    with pytest.raises(SpecError, match="largest of microbatch_sizes"):
        plain.replace(microbatch_sizes=(2, 14, 14, 2))
    with pytest.raises(ValueError, match="such as 2,14,14,2"):
        parse_sizes("2,x")
    with pytest.raises(ValueError, match="each at least 1"):
        parse_sizes("4,0,4")


def test_the_flag_sets_the_cut():
    a = build_parser().parse_args(["local", "--preset", "small", "--microbatch-sizes", "4,12,12,4"])
    spec = spec_from_args(a)
    assert spec.microbatch_sizes == (4, 12, 12, 4) and spec.batch_size == 32 and spec.microbatch_size == 12
    assert "--microbatch-sizes" in build_parser()._subparsers._group_actions[0].choices["local"].format_help()
