"""The RunSpec options of docs/fidelity.md 3d: lr multipliers of the constrained stages and weights, and
the scale of the frozen token code T_fixed. Defaults leave every existing run's hash as it was."""
from __future__ import annotations

import pytest
import torch

from protocol.model import build_stage, spec_basis
from protocol.optim import make_optimizer, set_lr
from protocol.spec import RunSpec, SpecError, preset

NEW = ("constrained_lr_scale", "constrained_stage_lr_scale", "t_fixed_std")


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=16, n_layers=3, stages=3, batch_size=4,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64", weight_decay=0.1, lr=1e-2)
    base.update(kw)
    return preset("tiny", **base)


def test_defaults_keep_the_run_hash_of_existing_specs():
    # the hashes these specs had before the options existed (computed at commit c9c7bde); `small` now
    # defaults to a stage lr of 0.03, so the published method's spec names its 1.0
    assert preset("small", constrained_stage_lr_scale=1.0).run_hash == "23dd1f4f8547367b"
    assert RunSpec().run_hash == "44100fcce5f2ff5d"
    assert all(name not in RunSpec().to_dict() for name in NEW)
    # an old spec file (no such keys) loads to the same spec, and 1 or 1.0 written out hashes alike
    assert RunSpec.from_json(RunSpec().to_json()) == RunSpec()
    assert RunSpec(constrained_lr_scale=1).run_hash == RunSpec().run_hash


def test_set_options_are_part_of_the_hash_and_round_trip():
    spec = RunSpec(constrained_lr_scale=4, constrained_stage_lr_scale=0.5, t_fixed_std=0.3)
    d = spec.to_dict()
    assert (d["constrained_lr_scale"], d["constrained_stage_lr_scale"], d["t_fixed_std"]) == (4.0, 0.5, 0.3)
    assert RunSpec.from_json(spec.to_json()) == spec
    assert len({RunSpec().run_hash, spec.run_hash, RunSpec(constrained_lr_scale=2).run_hash,
                RunSpec(constrained_stage_lr_scale=2).run_hash, RunSpec(t_fixed_std=0.3).run_hash}) == 5


@pytest.mark.parametrize("over,word", [(dict(constrained_lr_scale=0.0), "constrained_lr_scale"),
                                       (dict(constrained_stage_lr_scale=-1.0), "constrained_stage_lr_scale"),
                                       (dict(t_fixed_std=0.0), "t_fixed_std"),
                                       (dict(codec="dense", constrained_lr_scale=2.0), "subspace codec"),
                                       (dict(codec="bottleneck", t_fixed_std=0.5), "subspace codec")])
def test_bad_values_are_refused_with_the_field_named(over, word):
    with pytest.raises(SpecError, match=word):
        RunSpec(**over)


def test_lr_scales_per_group_and_stage():
    default = small()
    for stage in range(3):  # a default run's optimizer state has no new key
        opt = make_optimizer(default, build_stage(default, stage, spec_basis(default)))
        assert all("lr_scale" not in g for g in opt.param_groups)
    spec = small(constrained_lr_scale=4.0, constrained_stage_lr_scale=0.5)
    basis = spec_basis(spec)
    for stage, (free, constrained) in enumerate([(0.5, 2.0), (0.5, 2.0), (1.0, None)]):
        opt = make_optimizer(spec, build_stage(spec, stage, basis))
        set_lr(opt, 1e-3)
        for g in opt.param_groups:
            want = constrained if g["constraint"] else free
            assert g["lr"] == pytest.approx(1e-3 * want), (stage, g["constraint"])
        assert any(g["constraint"] for g in opt.param_groups) == (constrained is not None)


@pytest.mark.parametrize("codec", ["dense", "bottleneck"])
def test_the_stage_lr_applies_to_every_codec(codec):
    """The stage lr is a lever of any lossy boundary (docs/fidelity.md 3j): the stages before the last of a dense
    or bottleneck run train at its multiple of the lr, the last at the lr; the span(U) options stay refused."""
    spec = small(codec=codec, constrained_stage_lr_scale=0.25)
    assert spec.run_hash != small(codec=codec).run_hash
    for stage, want in enumerate((0.25, 0.25, 1.0)):
        opt = make_optimizer(spec, build_stage(spec, stage, spec_basis(spec)))
        set_lr(opt, 1e-3)
        assert [g["lr"] for g in opt.param_groups] == pytest.approx([1e-3 * want] * len(opt.param_groups))
    with pytest.raises(SpecError, match="subspace codec"):
        small(codec=codec, constrained_lr_scale=2.0)


@pytest.mark.parametrize("over,scale_free,scale_constrained", [(dict(constrained_lr_scale=4.0), 1.0, 4.0),
                                                               (dict(constrained_stage_lr_scale=0.25), 0.25, 0.25)])
def test_a_scaled_step_moves_each_weight_by_the_scale(over, scale_free, scale_constrained):
    """AdamW's first step (decay included) is linear in lr: with the same gradients every weight moves
    exactly scale times as far as under the default spec."""
    deltas = []
    for spec in (small(), small(**over)):
        module = build_stage(spec, 0, spec_basis(spec))
        opt = make_optimizer(spec, module)
        start = [p.detach().clone() for p in module.parameters()]
        g = torch.Generator().manual_seed(0)
        for p in module.parameters():
            p.grad = torch.randn(p.shape, generator=g, dtype=p.dtype)
        set_lr(opt, 1e-2)
        opt.step()
        deltas.append([p.detach() - s for p, s in zip(module.parameters(), start)])
    kinds = {id(p): k for _, p, k in build_stage(small(), 0).constrained_parameters()}
    names = [n for n, _ in build_stage(small(), 0).named_parameters()]
    constrained_names = {n for n, _, _ in build_stage(small(), 0).constrained_parameters()}
    assert kinds
    for name, base, scaled in zip(names, *deltas):
        want = scale_constrained if name in constrained_names else scale_free
        assert torch.allclose(scaled, want * base, rtol=1e-9, atol=1e-15), name


def test_t_fixed_std_scales_only_the_token_code():
    a, b = spec_basis(small()), spec_basis(small(t_fixed_std=0.5))
    assert torch.equal(a.U, b.U)
    assert torch.allclose(b.T_fixed, a.T_fixed * 25, rtol=1e-12)  # 0.5 / 0.02, the same draw
    assert float(b.T_fixed.std()) == pytest.approx(0.5, rel=0.05)


def test_presets_from_d512_default_the_subspace_stage_lr_and_other_codecs_drop_it():
    # docs/fidelity.md 5: 0.03 from d=512 up (it hurt at d=256), only where there are stages before the last
    for name in ("small", "large", "xl", "record", "paper8b"):
        assert preset(name).constrained_stage_lr_scale == 0.03, name
        assert preset(name, codec="dense").constrained_stage_lr_scale == 1.0
        assert preset(name, codec="bottleneck").constrained_stage_lr_scale == 1.0
        assert preset(name, stages=1).constrained_stage_lr_scale == 1.0
    assert preset("tiny").constrained_stage_lr_scale == 1.0
    assert preset("tiny", d_model=512, n_heads=8).constrained_stage_lr_scale == 0.03
    assert preset("small", constrained_stage_lr_scale=0.5).constrained_stage_lr_scale == 0.5
    # another codec's run names its stage lr itself (never the subspace default)
    assert preset("small", codec="dense", constrained_stage_lr_scale=0.03).constrained_stage_lr_scale == 0.03
    assert preset("small").run_hash != preset("small", constrained_stage_lr_scale=1.0).run_hash


def test_with_codec_puts_the_subspace_options_back_for_another_codec():
    sub = preset("small", embed_split="per_stage", t_fixed_std=0.05, constrained_lr_scale=0.5)
    dense = sub.with_codec("dense", basis_updates=False)
    assert dense == preset("small", codec="dense", basis_updates=False)
    assert sub.with_codec("bottleneck", rank=16) == preset("small", codec="bottleneck", rank=16)
    assert sub.with_codec("subspace", rank=64) == sub.replace(rank=64)  # the subspace codec keeps its options
