"""Issue 24 item 2, "whether the gap shrinks with tokens", on a corpus large enough not to repeat: section 3f
found that at 8x the tokens the 13 MB `stdlib` corpus is ~5 passes and dense overfits from ~39M tokens on, so
the gap there was not a gap. Here the corpus is the device's Python standard library (tests excluded, as the
`stdlib` corpus) followed by its installed torch package's Python sources (tests excluded), one file, built on
the device (its size and sha256 go into OUT/corpus.json; it depends on the device's Python and torch versions).

`small` (the gpu plan's 3-3-2 shape, d=512, 16x = 32 numbers a token), dense against the hybrid's best
(k=28 b=4) and the subspace codec's default (k=32), both with the stages before the last at lr x0.03.
Usage: gap_corpus.py OUT PER_DEVICE BUDGET_S STEPS SEEDS NAMES   (SEEDS e.g. 0,1; NAMES a comma list of
dense,hybrid,subspace,hybrid24,hybrid20,hybrid-x0.1,hybrid-x0.01,bottleneck,bottleneck-x0.03,
dense-x0.03,hybrid-w300,hybrid-w600,hybrid-lr0.7,hybrid-lr1.4,dense-lr1.4,hybrid-w300-x0.1,
hybrid-w300-x0.05,hybrid-w300-x0.15,hybrid-w300-x0.2,hybrid30-w300,subspace-w300,hybrid100x,
hybrid100x-default,hybrid100x-w300,hybrid100x-w300-x0.15,hybrid100x-w300-x0.3,
hybrid100x-w300-x0.5,hybrid100x-w300-x1,hybrid100x-k4b1-x0.2,
hybrid100x-k2b3-x0.2,hybrid100x-w600-x0.2,
hybrid24-w300-x0.1,hybrid-w600-x0.1,hybrid-x0.1-to0.2,hybrid-x0.1-to0.03,
hybrid-x0.1-to0.3,hybrid-x0.1-to0.4,hybrid56-int8,hybrid60-int8,subspace64-int8).
Every seed is a group
with its own dense reference; OUT/fidelity.jsonl is resumed."""
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

from peer.data.corpus import _STDLIB_SKIP, DOCUMENT_SEPARATOR, _directory_files
from swarm.bench.fidelity import bench as fidelity
from swarm.bench.fidelity.plan import _job, dense, plan_shape

LOW = {"constrained_stage_lr_scale": 0.03}


def warmed(k: int, b: int, stage_lr: float, warmup: int = 300, ratio: str = "16x") -> tuple[str, dict, str]:
    """The hybrid k + b at a stage lr and a warm-up (sections 3k, 3n): (name, spec changes, note)."""
    name = f"hybrid k={k} b={b}, x{stage_lr:g}, {warmup} warm-up steps" + ("" if ratio == "16x" else f" ({ratio})")
    return name, {"rank": k, "residual_width": b, "warmup_steps": warmup, "constrained_stage_lr_scale": stage_lr}, ratio


def ramped(end: float) -> tuple[str, dict, str]:
    """3n's default (k=28 b=4, warm-up 300) with its stage lr moving from x0.1 to x`end` over the run (3p)."""
    name, change, note = warmed(28, 4, 0.1)
    return f"{name}, ramped to x{end:g}", {**change, "constrained_stage_lr_end": end}, note


def quantized(k: int, b: int, quant: str = "int8", ratio: str = "15.5x") -> tuple[str, dict, str]:
    """3n's default hybrid (x0.1, warm-up 300) at k + b numbers a token sent as `quant` with a scale a token."""
    name, change, _ = warmed(k, b, 0.1)
    return f"{name}, {quant} ({ratio})", {**change, "quant": quant}, ratio


VARIANTS = {"dense": ("dense", None, ""),
            "hybrid": ("hybrid k=28 b=4, stages lr x0.03", {"rank": 28, "residual_width": 4, **LOW}, "16x"),
            "subspace": ("subspace k=32, stages lr x0.03 (the default)", LOW, "16x"),
            # levers around the hybrid's best, at 1000 steps
            "hybrid24": ("hybrid k=24 b=8, stages lr x0.03", {"rank": 24, "residual_width": 8, **LOW}, "16x"),
            "hybrid20": ("hybrid k=20 b=12, stages lr x0.03", {"rank": 20, "residual_width": 12, **LOW}, "16x"),
            "hybrid-x0.1": ("hybrid k=28 b=4, stages lr x0.1",
                            {"rank": 28, "residual_width": 4, "constrained_stage_lr_scale": 0.1}, "16x"),
            "hybrid-x0.01": ("hybrid k=28 b=4, stages lr x0.01",
                             {"rank": 28, "residual_width": 4, "constrained_stage_lr_scale": 0.01}, "16x"),
            # the stage lr on the other codecs (section 3j): the bottleneck at b=32 (16x) and dense itself
            "bottleneck": ("bottleneck b=32", {"codec": "bottleneck", "rank": 32}, "16x"),
            "bottleneck-x0.03": ("bottleneck b=32, stages lr x0.03",
                                 {"codec": "bottleneck", "rank": 32, **LOW}, "16x"),
            "dense-x0.03": ("dense, stages lr x0.03", {"codec": "dense", **LOW}, ""),
            # the lr and warm-up per codec (section 3k): the hybrid's best and dense, each moved one way
            "hybrid-w300": warmed(28, 4, 0.03),
            "hybrid-w600": warmed(28, 4, 0.03, 600),
            "hybrid-lr0.7": ("hybrid k=28 b=4, x0.03, lr 7e-4", {"rank": 28, "residual_width": 4, "lr": 7e-4, **LOW},
                             "16x"),
            "hybrid-lr1.4": ("hybrid k=28 b=4, x0.03, lr 1.4e-3",
                             {"rank": 28, "residual_width": 4, "lr": 1.4e-3, **LOW}, "16x"),
            "dense-lr1.4": ("dense, lr 1.4e-3", {"codec": "dense", "lr": 1.4e-3}, ""),
            # levers on top of the hybrid's new default warm-up (section 3n), and the subspace codec's own warm-up
            "hybrid-w300-x0.1": warmed(28, 4, 0.1),
            "hybrid-w300-x0.05": warmed(28, 4, 0.05),
            "hybrid-w300-x0.15": warmed(28, 4, 0.15),
            "hybrid-w300-x0.2": warmed(28, 4, 0.2),
            "hybrid30-w300": warmed(30, 2, 0.03),
            # ~100x (5 numbers a token = 102x): 3h's best split at its stage lr and warm-up, and at the defaults of 3n
            "hybrid100x": ("hybrid k=3 b=2, x0.03 (102x)", {"rank": 3, "residual_width": 2, **LOW}, "102x"),
            "hybrid100x-default": warmed(3, 2, 0.1, ratio="102x"),
            "hybrid100x-w300": warmed(3, 2, 0.03, ratio="102x"),
            # the 16x stage-lr lever x0.15 (section 3s, at a BPE vocabulary of 32,768) on the ~100x hybrid
            "hybrid100x-w300-x0.15": warmed(3, 2, 0.15, ratio="102x"),
            # and above it (section 3s: x0.03 -> x0.1 -> x0.15 each closed part of the ~100x gap)
            "hybrid100x-w300-x0.3": warmed(3, 2, 0.3, ratio="102x"),
            "hybrid100x-w300-x0.5": warmed(3, 2, 0.5, ratio="102x"),
            "hybrid100x-w300-x1": warmed(3, 2, 1.0, ratio="102x"),
            # the other splits of 5 numbers a token, and a longer warm-up, at x0.2 (between the best two above)
            "hybrid100x-k4b1-x0.2": warmed(4, 1, 0.2, ratio="102x"),
            "hybrid100x-k2b3-x0.2": warmed(2, 3, 0.2, ratio="102x"),
            "hybrid100x-w600-x0.2": warmed(3, 2, 0.2, 600, ratio="102x"),
            "subspace-w300": ("subspace k=32, x0.03, 300 warm-up steps", {"warmup_steps": 300, **LOW}, "16x"),
            # levers at 2x the tokens on top of 3n's default (section 3o): the other split, a longer warm-up
            "hybrid24-w300-x0.1": warmed(24, 8, 0.1),
            "hybrid-w600-x0.1": warmed(28, 4, 0.1, 600),
            # a stage lr that changes over the run (section 3p): from 3n's x0.1 at the warm-up's end to x0.2 or x0.03
            "hybrid-x0.1-to0.2": ramped(0.2),
            "hybrid-x0.1-to0.03": ramped(0.03),
            "hybrid-x0.1-to0.3": ramped(0.3),
            "hybrid-x0.1-to0.4": ramped(0.4),
            # rank against int8 at equal bytes (issue 24 item 2) on the hybrid's default and on the subspace codec's:
            # twice the numbers a token at 1 byte each (plus a 2-byte scale a token: 66 bytes, 15.5x, against 64)
            "hybrid56-int8": quantized(56, 8),
            "hybrid60-int8": quantized(60, 4),
            "subspace64-int8": ("subspace k=64 int8, stages lr x0.03 (15.5x)", {"rank": 64, "quant": "int8", **LOW},
                                "15.5x")}


def build_corpus(out: Path) -> Path:
    """stdlib (tests excluded) then torch's sources (tests excluded), in sorted order, as one file."""
    import torch
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(torch.__file__).parent]
    files = [f for root in roots for f in _directory_files(root, _STDLIB_SKIP | {"testing"})]
    data = DOCUMENT_SEPARATOR.join(b for b in (f.read_bytes() for f in files) if b)
    path, part = Path("/tmp/gap_corpus.txt"), Path(f"/tmp/gap_corpus.{os.getpid()}")
    part.write_bytes(data)
    part.replace(path)  # whole at once: two calls side by side each build it while the other's jobs read it
    (out / "corpus.json").write_text(json.dumps({
        "bytes": len(data), "files": len(files), "sha256": hashlib.sha256(data).hexdigest(),
        "roots": [str(r) for r in roots], "torch": torch.__version__, "python": sys.version.split()[0]}, indent=1))
    return path


def corpus_jobs(steps: int, seeds: list[int], names: list[str]) -> list:
    s = plan_shape("gpu")
    out = []
    for seed in seeds:
        base, group = s.base.replace(total_steps=steps, seed=seed), f"corpus{steps}-seed{seed}"
        for n in names:
            label, change, note = VARIANTS[n]
            if change is None:
                spec = dense(base)
            elif "codec" in change:
                spec = base.with_codec(**change)
            else:
                spec = base.replace(**change)
            out.append(_job(label, group, spec, 0, note))
    return out


def run_jobs(jobs: list, argv: list[str]) -> None:
    """The GPU call of this script and its siblings (learned_gap.py, determinism.py): argv = OUT PER_DEVICE
    BUDGET_S ...; `jobs` into OUT on the corpus built there, resumed from OUT/fidelity.jsonl."""
    out_dir = Path(argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    fidelity.jobs_for = lambda plan, groups, best=None: jobs
    fidelity.run_fidelity_bench(str(out_dir), plan="gpu", device="cuda", parallel=1, per_device=int(argv[2]),
                                budget_s=float(argv[3]), groups=tuple(sorted({j.group for j in jobs})),
                                data=str(build_corpus(out_dir)), resume=True)


if __name__ == "__main__":  # the queue's workers are spawned: they import this file again
    run_jobs(corpus_jobs(int(sys.argv[4]), [int(x) for x in sys.argv[5].split(",")], sys.argv[6].split(",")),
             sys.argv)
