"""`swarm bench convergence`'s curves take the preset's stage lr (0.03 on `small` since docs/fidelity.md 5)
or the one --constrained-stage-lr names; its dense and bottleneck curves never take it."""
from __future__ import annotations

import swarm.bench.record.convergence as convergence
from swarm.cli import build_parser


def _specs(monkeypatch, argv: list[str]) -> dict:
    seen = {}

    def capture(out, preset_name, variants, *rest, **kw):
        seen.update(variants)
        return {"preset": preset_name, "curves": {}}
    monkeypatch.setattr(convergence, "train_curves", capture)
    a = build_parser().parse_args(["bench", "convergence", "--out", "unused", *argv])
    convergence._train_all(a.out, a.preset, a.steps, (500,), None, "cpu", 100, 2, False, False, None,
                           a.constrained_stage_lr)
    return seen


def test_the_subspace_curves_take_the_stage_lr_and_the_other_codecs_do_not(monkeypatch):
    default = _specs(monkeypatch, [])
    assert {n: s.constrained_stage_lr_scale for n, s in default.items()} == {
        "fixed U": 0.03, "U re-fit every 500": 0.03, "dense": 1.0, "bottleneck": 1.0}
    published = _specs(monkeypatch, ["--constrained-stage-lr", "1"])
    assert all(s.constrained_stage_lr_scale == 1.0 for s in published.values())
    # only the stage lr differs: the same data, shape, seeds and schedule
    assert published["fixed U"] == default["fixed U"].replace(constrained_stage_lr_scale=1.0)
    assert published["dense"] == default["dense"]
