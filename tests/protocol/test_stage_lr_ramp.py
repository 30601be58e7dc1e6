"""`constrained_stage_lr_end` (docs/fidelity.md 3p): the stage lr of the stages before the last moves linearly from
`constrained_stage_lr_scale` at the warm-up's end to the end value at total_steps; the last stage keeps the lr."""
from __future__ import annotations

import pytest

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.optim import lr_at, stage_lr_ratio
from protocol.spec import RunSpec, SpecError, preset


def small(**kw):
    base = dict(d_model=32, n_heads=4, d_ff=64, seq_len=16, n_layers=3, stages=3, batch_size=4,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64", lr=1e-2, warmup_steps=4, total_steps=24,
                constrained_stage_lr_scale=0.1)
    base.update(kw)
    return preset("tiny", **base)


def test_the_ratio_holds_through_the_warm_up_then_moves_linearly_to_the_end():
    spec = small(constrained_stage_lr_end=0.3)
    scale = [0.1 * stage_lr_ratio(spec, s) for s in (0, 3, 4, 14, 24, 40)]
    assert scale == pytest.approx([0.1, 0.1, 0.1, 0.2, 0.3, 0.3], rel=1e-12)
    assert [stage_lr_ratio(small(), s) for s in (0, 14, 40)] == [1.0, 1.0, 1.0]  # no end, no ramp


def test_the_ramp_is_hash_neutral_off_and_hashed_on():
    assert "constrained_stage_lr_end" not in RunSpec().to_dict()
    on = small(constrained_stage_lr_end=0.3)
    assert on.to_dict()["constrained_stage_lr_end"] == 0.3 and on.run_hash != small().run_hash
    assert RunSpec.from_json(on.to_json()) == on
    assert on.with_codec("dense").constrained_stage_lr_end == 0.0  # another codec's run names its own


@pytest.mark.parametrize("over,word", [(dict(constrained_stage_lr_end=-0.1), "constrained_stage_lr_end"),
                                       (dict(constrained_stage_lr_end=0.3, total_steps=0), "total_steps"),
                                       (dict(constrained_stage_lr_end=0.3, total_steps=4), "total_steps")])
def test_bad_ramps_are_refused_with_what_to_set(over, word):
    with pytest.raises(SpecError, match=word):
        small(**over)


def test_a_trained_pipeline_gives_each_stage_its_ramped_lr():
    """After each step the groups of stages 0-1 hold lr x s(step) and the last stage's hold the lr; a ramp changes
    the weights the run reaches (it is not a no-op)."""
    corpus = load_corpus(None, seq_len=16)
    ends = {}
    for end in (0.0, 0.4):
        spec = small(constrained_stage_lr_end=end)
        src = BatchSource(corpus, spec.seq_len, spec.microbatch_size, seed=3)
        pipe = InProcessPipeline(spec)
        for step in range(spec.total_steps):
            pipe.train_step(step, src.microbatch)
            stage_scale = 0.1 * stage_lr_ratio(spec, step)
            for r in pipe.runners:
                want = lr_at(spec, step) * (1.0 if r.is_last else stage_scale)
                assert [g["lr"] for g in r.optimizer.param_groups] == pytest.approx(
                    [want] * len(r.optimizer.param_groups), rel=1e-12), (end, step, r.stage)
        ends[end] = [p.detach().clone() for p in pipe.runners[0].module.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(ends[0.0], ends[0.4])) > 1e-4
