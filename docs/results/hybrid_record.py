"""Issue 24: the hybrid codec in the record setting (`swarm bench record`'s `record` preset: d=1024, 16 layers in
8 stages, batch 64 x 256, bf16, fixed U, 396 steps = 6.49M tokens), at 16x (64 numbers a token: k=48 exact
coordinates + b=16 of the bottleneck) with the stages before the last at 0.03 x the lr, trained beside the subspace
codec at 16x with the same stage lr (k=64) on one card, seed 0. Dense is the H100 curve of
docs/img/record-gpu-h100-convergence.json (the same spec; a different card, so its gaps carry that machine's
difference); the two compressed curves are compared with each other on one card. With WARMUP only hybrids train,
warming up over that many steps instead of the preset's 100 (the hybrid's default is 3x the preset's), one for each
stage lr of STAGE_LRS (default 0.03; section 3n); the subspace codec's curve is the one of the call without.
Usage: hybrid_record.py OUT [WARMUP [STAGE_LR,...]]"""
import json
import sys
from pathlib import Path

from protocol.spec import RunSpec
from swarm.bench.record.bench import record_specs
from swarm.bench.record.convergence import train_curves

if __name__ == "__main__":  # the training processes are spawned: they import this file again
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    specs = record_specs(6_500_000, variants=("dense", "subspace-16x-lr0.03"))
    sub = specs["subspace-16x-lr0.03"]
    hybrid = sub.replace(rank=sub.rank - sub.rank // 4, residual_width=sub.rank // 4)
    curves = {"subspace-16x-lr0.03": sub, "hybrid-16x-lr0.03": hybrid}
    if len(sys.argv) > 2:
        w, lrs = int(sys.argv[2]), (sys.argv[3] if len(sys.argv) > 3 else "0.03").split(",")
        curves = {f"hybrid-16x-lr{x}-w{w}": hybrid.replace(warmup_steps=w, constrained_stage_lr_scale=float(x))
                  for x in lrs}
    h100 = json.loads(Path("docs/img/record-gpu-h100-convergence.json").read_text())
    dense = h100["curves"]["dense"]
    assert RunSpec.from_dict(dense["spec"]) == specs["dense"], "the H100 dense curve is of another spec"
    conv = train_curves(out, "record", curves, "stdlib", "cuda", max(1, specs["dense"].total_steps // 20), 16,
                        done={"dense": dense})
    for name, s in conv["summary"].items():
        print(f"{name:>22}: final held-out {s['final_val']:.4f} ({s['vs_dense']:+.1%} vs the H100 dense)")
