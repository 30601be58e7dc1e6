"""Tables and the figure of `swarm bench fidelity`, from the job results (fidelity.jsonl lines).

References, each trained in the same run on the same data and seeds:
- a frontier or ablation row is compared with the frontier's `dense` and its subspace
  baseline `subspace k=<d/16> fixed U` (same steps): `vs_dense`, `vs_base` = loss / ref - 1;
- a scale row with the dense row of its own width; a headline row with the headline `dense`;
- a row of a group with its own `dense` row (`gap`, `gap-seed1`, `gap-seed2`, `hybrid`) with that
  group's `dense` and `subspace k=<d/16> fixed U`.
A dense reference's loss is the mean final_val of its job and of the job's repeats "NAME (run i)"
(`--dense-runs N`; dense on a GPU is not bit-repeatable, docs/fidelity.md 3m): ref = mean over its
ok runs, so vs_dense = loss / mean - 1 for every row, the dense runs' own rows included. The
reference's row records `dense_runs` (how many ok runs the mean took) and `dense_spread` (max - min
of their final_val): how noisy the reference was.
Jobs that were skipped, failed or truncated keep their row, with the reason, and are left out
of every comparison (a truncated job trained fewer tokens than its reference).
"""
from __future__ import annotations

import math
import re
from pathlib import Path


def _ok(r: dict) -> bool:
    return not r.get("error") and not r.get("truncated") and math.isfinite(r.get("final_val", math.nan))


def _find(results: list[dict], group: str, name: str) -> dict | None:
    return next((r for r in results if r["group"] == group and r["name"] == name and _ok(r)), None)


def _dense_ref(results: list[dict], group: str, name: str) -> dict | None:
    """The dense reference `group`/`name` over its ok runs (the job and its repeats "NAME (run i)"):
    final_val = their mean, runs = how many, spread = max - min of their final_val; None if none is ok."""
    repeat = re.compile(re.escape(name) + r"( \(run \d+\))?")
    vals = [r["final_val"] for r in results if r["group"] == group and repeat.fullmatch(r["name"]) and _ok(r)]
    if not vals:
        return None
    return {"final_val": sum(vals) / len(vals), "runs": len(vals), "spread": max(vals) - min(vals)}


def _rel(a: dict, ref: dict | None) -> float | None:
    return a["final_val"] / ref["final_val"] - 1 if ref is not None and _ok(a) else None


def baseline_name(results: list[dict]) -> str | None:
    """The subspace baseline of the frontier: its fixed-U row at k = d/16."""
    for r in results:
        if r["group"] == "frontier" and r["spec"]["codec"] == "dense":
            return f"subspace k={max(1, r['spec']['d_model'] // 16)} fixed U"
    return None


def summarize(results: list[dict]) -> list[dict]:
    """One row per job: loss, compression, and its comparisons (None where a reference is missing);
    a dense reference is the mean of its runs (`_dense_ref`), its own row says over how many and their spread."""
    f_dense = _dense_ref(results, "frontier", "dense")
    base_name = baseline_name(results)
    base = _find(results, "frontier", base_name) if base_name else None
    h_dense = _dense_ref(results, "headline", "dense")
    rows = []
    for r in results:
        row = {k: r.get(k) for k in ("group", "name", "note", "final_val", "compression", "steps", "tokens",
                                     "seconds", "tokens_per_second", "truncated", "switches", "truncation",
                                     "error", "device")}
        if r["group"] == "scale":
            d = row["d_model"] = r["spec"]["d_model"]
            ref_key = ("scale", f"d={d} dense")
            ref = _dense_ref(results, *ref_key)
        elif r["group"] == "headline":
            ref_key, ref = ("headline", "dense"), h_dense
        elif r["group"] != "frontier" and (ref := _dense_ref(results, r["group"], "dense")) is not None:
            ref_key = (r["group"], "dense")
            own = f"subspace k={max(1, r['spec']['d_model'] // 16)} fixed U"
            row["vs_base"] = _rel(r, _find(results, r["group"], own))
        else:
            ref_key, ref = ("frontier", "dense"), f_dense
            row["vs_base"] = _rel(r, base)
        row["vs_dense"] = _rel(r, ref)
        if ref is not None and (r["group"], r["name"]) == ref_key:  # the reference's own row: how noisy the mean is
            row["dense_runs"], row["dense_spread"] = ref["runs"], ref["spread"]
        rows.append(row)
    return rows


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"


def markdown_table(rows: list[dict]) -> str:
    """The rows as a markdown table (what docs/fidelity.md shows)."""
    lines = ["| group | job | held-out loss | compression | vs dense | vs subspace base | tokens | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = f"{r['final_val']:.4f}" if r["final_val"] is not None and math.isfinite(r["final_val"]) else "-"
        note = r["error"] or ("truncated" if r["truncated"] else "") or r.get("note") or ""
        if r.get("dense_runs", 1) > 1:
            note = "; ".join(x for x in (note, f"reference: mean of {r['dense_runs']} runs "
                                               f"(spread {r['dense_spread']:.4f})") if x)
        lines.append(f"| {r['group']} | {r['name']} | {loss} | {r['compression']:.1f}x | {_pct(r.get('vs_dense'))} "
                     f"| {_pct(r.get('vs_base'))} | {r['tokens'] / 1e6:.2f}M | {note} |")
    return "\n".join(lines)


def plot(results: list[dict], rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    (fr, ab), (sc, cu) = axes
    front = [r for r in results if r["group"] == "frontier" and _ok(r)]
    def sub(r: dict, refit: bool, quant: str) -> bool:
        sp = r["spec"]
        return sp["codec"] == "subspace" and sp["basis_updates"] == refit and sp["quant"] == quant

    series = {"subspace, fixed U": lambda r: sub(r, False, "none"),
              "subspace, re-fitted U": lambda r: sub(r, True, "none"),
              "subspace, int8 wire, fixed U": lambda r: sub(r, False, "int8"),
              "bottleneck": lambda r: r["spec"]["codec"] == "bottleneck"}
    for label, keep in series.items():
        pts = sorted((r["compression"], r["final_val"]) for r in front if keep(r))
        if pts:
            fr.plot(*zip(*pts), marker="o", label=label)
    dense = _dense_ref(results, "frontier", "dense")
    if dense:
        fr.axhline(dense["final_val"], color="k", linestyle=":", label="dense")
    fr.set_xscale("log", base=2)
    fr.set_xlabel("boundary compression (payload bytes per token, dense / codec)")
    fr.set_ylabel("held-out loss (nats/byte)")
    fr.set_title("frontier")
    if fr.get_legend_handles_labels()[0]:
        fr.legend(fontsize=8)
    abl = [r for r in rows if r["group"] not in ("frontier", "scale", "headline") and r.get("vs_dense") is not None]
    if abl:
        ab.barh([f"{r['group']}: {r['name']}" for r in abl], [100 * r["vs_dense"] for r in abl], color="tab:blue")
        base = next((r for r in rows if r["group"] == "frontier" and r["name"] == baseline_name(results)), None)
        if base is not None and base.get("vs_dense") is not None:
            ab.axvline(100 * base["vs_dense"], color="tab:red", linestyle="--", label="subspace baseline")
            ab.legend(fontsize=8)
        ab.tick_params(axis="y", labelsize=7)
    ab.set_xlabel("held-out loss vs dense (%)")
    ab.set_title("ablations (one change each)")
    # the subspace rows only: a dense row's vs_dense is no longer 0 against the mean of several dense runs
    dense_jobs = {(r["group"], r["name"]) for r in results if r["spec"]["codec"] == "dense"}
    pairs = sorted((r["d_model"], 100 * r["vs_dense"]) for r in rows if r["group"] == "scale"
                   and r.get("vs_dense") is not None and (r["group"], r["name"]) not in dense_jobs)
    if pairs:
        sc.plot(*zip(*pairs), marker="o")
        sc.set_xscale("log", base=2)
    sc.set_xlabel("d_model (k = d/100)")
    sc.set_ylabel("subspace vs dense held-out loss (%)")
    sc.set_title("scale: the gap against width")
    for r in results:
        if r["group"] in ("headline", "scale") and r.get("val"):
            cu.plot(*zip(*r["val"]), label=f"{r['group']}: {r['name']}")
    cu.set_xlabel("tokens")
    cu.set_ylabel("held-out loss")
    cu.set_title("held-out loss curves (headline, scale)")
    if cu.get_legend_handles_labels()[0]:
        cu.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
