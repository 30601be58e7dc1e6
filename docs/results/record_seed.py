"""A second seed of `swarm bench record`'s curves (issue 24: each figure with 2 seeds): dense and the
stage-lr lever at ~100x and 16x, weights, U and T_fixed from seed 1 (the data order as in seed 0),
the same token budget as docs/img/record-gpu-h100.json, sharing one card. The tokens/s do not
depend on the seed: record_figures takes them from that JSON. A curve of OUT/convergence.json
trained with the same spec is kept. Usage: record_seed.py OUT [SEED [CODEC_TOKENS [NAME,...]]]
(CODEC_TOKENS as `--codec-tokens`: the compressed variants train that many times dense's tokens)."""
import json
import sys
from pathlib import Path

from swarm.bench.record.bench import _reusable_curves, record_figures, record_specs
from swarm.bench.record.convergence import train_curves

NAMES = ("dense", "subspace-lr0.03", "subspace-16x-lr0.03")

if __name__ == "__main__":  # the training processes are spawned: they import this file again
    out, seed = Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 1
    out.mkdir(parents=True, exist_ok=True)
    codec_tokens = float(sys.argv[3]) if len(sys.argv) > 3 else 1.0
    names = ("dense", *sys.argv[4].split(",")) if len(sys.argv) > 4 else NAMES
    specs = {n: s.replace(seed=seed) for n, s in record_specs(6_500_000, codec_tokens=codec_tokens,
                                                              variants=names).items()}
    done = _reusable_curves(out / "convergence.json", specs)
    conv = train_curves(out, "record", {n: s for n, s in specs.items() if n not in done}, "stdlib", "cuda",
                        max(1, specs["dense"].total_steps // 20), 16, done=done)
    seed0 = json.loads(Path("docs/img/record-gpu-h100.json").read_text())
    tps = {n: seed0["target_dense_final"]["codecs"][n]["tokens_per_second"] for n in names}
    rows = record_figures(conv["curves"], tps, conv["curves"]["dense"]["val"][-1][1])
    summary = {"seed": seed, "codec_tokens": codec_tokens, "tokens_per_second_from": "record-gpu-h100.json",
               "target_dense_final": rows}
    (out / "record-seed.json").write_text(json.dumps(summary, indent=1) + "\n")
    for n, r in rows.items():
        print(f"{n:>20}: final {r['final_val']:.4f}, steps ratio {r['steps_ratio']}, x sooner {r['x_sooner']}")
