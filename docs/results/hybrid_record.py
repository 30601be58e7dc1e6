"""Issue 24: the hybrid codec in the record setting (`swarm bench record`'s `record` preset: d=1024, 16 layers in
8 stages, batch 64 x 256, bf16, fixed U, 396 steps = 6.49M tokens), at 16x (64 numbers a token: k=48 exact
coordinates + b=16 of the bottleneck) with the stages before the last at 0.03 x the lr, trained beside the subspace
codec at 16x with the same stage lr (k=64) on one card, seed 0. Dense is the H100 curve of
docs/img/record-gpu-h100-convergence.json (the same spec; a different card, so its gaps carry that machine's
difference); the two compressed curves are compared with each other on one card. With WARMUP both warm up over
that many steps instead of the preset's 100 (section 3n: the hybrid's default is 3x the preset's).
Usage: hybrid_record.py OUT [WARMUP]"""
import json
import sys
from pathlib import Path

from protocol.spec import RunSpec
from swarm.bench.convergence import train_curves
from swarm.bench.record import record_specs

if __name__ == "__main__":  # the training processes are spawned: they import this file again
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    specs = record_specs(6_500_000, variants=("dense", "subspace-16x-lr0.03"))
    sub = specs["subspace-16x-lr0.03"]
    hybrid = sub.replace(rank=sub.rank - sub.rank // 4, residual_width=sub.rank // 4)
    tag = ""
    if len(sys.argv) > 2:
        tag = f"-w{int(sys.argv[2])}"
        sub, hybrid = (s.replace(warmup_steps=int(sys.argv[2])) for s in (sub, hybrid))
    h100 = json.loads(Path("docs/img/record-gpu-h100-convergence.json").read_text())
    dense = h100["curves"]["dense"]
    assert RunSpec.from_dict(dense["spec"]) == specs["dense"], "the H100 dense curve is of another spec"
    curves = {f"subspace-16x-lr0.03{tag}": sub, f"hybrid-16x-lr0.03{tag}": hybrid}
    conv = train_curves(out, "record", curves, "stdlib", "cuda", max(1, specs["dense"].total_steps // 20), 16,
                        done={"dense": dense})
    for name, s in conv["summary"].items():
        print(f"{name:>22}: final held-out {s['final_val']:.4f} ({s['vs_dense']:+.1%} vs the H100 dense)")
