"""Issue 54 item 2, where dense's time goes in the record's setting (8 stages, 200 Mbit/s, 50 ms): the simulator,
calibrated on the measured dense swarm of docs/results/simulate_record_h100_20261207 (one H100, 2026-12-07: 2,737
tokens/s, 5.98 s a step, its middle stages' uplinks busy 0.46 of the step), run with more and smaller microbatches
in the same batch (64 x 256 tokens), with and without the fitted cost a frame.

A link-bound pipeline of S stages and M microbatches keeps a middle uplink busy at most M / (M + S - 1) of a step
(the fill and the drain: 8 / 15 = 0.53 at the record's M = 8), whatever overlaps what: that bound, not the overlap
of sends with compute, is what the measured 0.46 is near. Smaller microbatches raise the bound (M = 32: 0.82) but
pay the per-frame cost 4x as often. The stage jobs of a microbatch of m sequences are taken as (m / 8) of the
calibrated ones (an assumption: on a GPU small microbatches cost more per token, so the figures at M = 32 and 64
are upper bounds). Prints a table and writes OUT/dense_record_bubble.json.

Usage: PYTHONPATH=. python3 docs/results/dense_record_bubble.py OUT
"""
import json
import sys
from dataclasses import replace
from pathlib import Path

from protocol.spec import RunSpec
from swarm.bench.simulate.record_measure import work_of
from swarm.bench.simulate.validate import Case, simulated

MEASURED = Path(__file__).parent / "simulate_record_h100_20261207/run1/record_measured.json"
PREDICTED = Path(__file__).parent / "simulate_record_h100_20261207/run1/simulate_record.json"
LINK_BPS = 200e6


def main(out: Path) -> None:
    measured = json.loads(MEASURED.read_text())
    row = next(r for r in measured["swarms"] if r["variant"] == "dense")
    fitted = next(c for c in json.loads(PREDICTED.read_text())["cases"] if c["variant"] == "dense")["fitted_frame_s"]
    spec, work = RunSpec.from_dict(row["spec"]), work_of(row)
    worst = max(p["bytes_sent_per_token"] for p in row["shaped"]["peers"])
    roofline = LINK_BPS / 8 / worst
    case = Case("dense", 1, "200mbit", "50ms")
    rows = []
    for mb in (8, 4, 2, 1):
        s = spec.replace(microbatch_size=mb)
        scale = mb / spec.microbatch_size
        w = replace(work, forward=tuple(f * scale for f in work.forward),
                    backward=tuple(b * scale for b in work.backward))
        m = s.n_microbatches
        for frame_s in (fitted, 0.0):
            sim = simulated(s, w, case, row["steps"], measured["cores"], frame_s)
            tps = sim["tokens_per_second"]
            rows.append({"microbatch_size": mb, "microbatches": m, "frame_s": frame_s, "tokens_per_second": tps,
                         "of_roofline": tps / roofline, "bound": m / (m + spec.n_stages - 1),
                         "median_step_s": sim["median_step_s"]})
            print(f"mb {mb} (M={m:2d}) frame {1e3 * frame_s:4.1f} ms: {tps:6.0f} tok/s, {tps / roofline:.2f} of the "
                  f"roofline ({roofline:.0f}); fill/drain bound {m / (m + spec.n_stages - 1):.2f}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dense_record_bubble.json").write_text(json.dumps({
        "measured_from": str(MEASURED.relative_to(Path(__file__).parent)),
        "measured_tokens_per_second": row["shaped"]["tokens_per_second"], "roofline_tokens_per_second": roofline,
        "worst_bytes_per_token": worst, "fitted_frame_s": fitted, "rows": rows}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
