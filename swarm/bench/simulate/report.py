"""What `swarm bench simulate` concludes from its runs, and its plot.

`matches`: per codec and schedule, the smallest simulated N whose tokens/s reaches one A100's and
one H100's (the whole model on one card, same MFU), the N with the most tokens/s (where adding
peers stops helping) and that figure as a multiple of each card. The plot: tokens/s against N
per codec (log-log, the one-GPU rates as horizontal lines), and goodput against the mean peer
lifetime.
"""
from __future__ import annotations

from pathlib import Path


def matches(rows: list[dict], reference: dict[str, float]) -> list[dict]:
    out = []
    for codec in dict.fromkeys(r["codec"] for r in rows):
        for ehw in dict.fromkeys(r["every_head_works"] for r in rows):
            curve = sorted((r for r in rows if r["codec"] == codec and r["every_head_works"] == ehw),
                           key=lambda r: r["peers"])
            best = max(curve, key=lambda r: r["tokens_per_second"])
            row = {"codec": codec, "every_head_works": ehw, "best_peers": best["peers"],
                   "best_tokens_per_second": best["tokens_per_second"]}
            for card, rate in reference.items():
                hit = next((r["peers"] for r in curve if r["tokens_per_second"] >= rate), None)
                row[f"peers_to_match_{card}"] = hit
                row[f"best_over_{card}"] = best["tokens_per_second"] / rate
            out.append(row)
    return out


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    rows = result["runs"]
    for i, codec in enumerate(dict.fromkeys(r["codec"] for r in rows)):
        for ehw in dict.fromkeys(r["every_head_works"] for r in rows):
            curve = sorted((r for r in rows if r["codec"] == codec and r["every_head_works"] == ehw),
                           key=lambda r: r["peers"])
            a.plot([r["peers"] for r in curve], [max(r["tokens_per_second"], 1e-3) for r in curve],
                   "o-" if not ehw else "s--", color=f"C{i}",
                   label=f"{codec}{', every head works (model)' if ehw else ''}")
    a.set_xscale("log")
    a.set_yscale("log")
    for card, rate in result["one_gpu_tokens_per_second"].items():
        a.axhline(rate, color="gray", lw=0.8, ls=":")
        a.text(min((r["peers"] for r in rows), default=1), rate, f"1 x {card}", fontsize=7, va="bottom", color="gray")
    a.set_xlabel("peers N")
    a.set_ylabel("tokens / s")
    m = result["model"]
    a.set_title(f"{result['preset']}: uplink {m['uplink_mbit'][0]:g}-{m['uplink_mbit'][1]:g} Mbit/s, "
                f"{m['replica_sync']} sync", fontsize=9)
    a.legend(fontsize=7)
    churn = result["churn"]
    for ehw, follow in dict.fromkeys((r["every_head_works"], r.get("follow", "sums")) for r in churn):
        pts = [r for r in churn if r["every_head_works"] == ehw and r.get("follow", "sums") == follow]
        calm = next((r["tokens_per_second"] for r in pts if r["lifetime_min"] is None), None)
        pts = [r for r in pts if r["lifetime_min"] is not None]
        if calm and pts:
            pts.sort(key=lambda r: r["lifetime_min"])
            label = ("every head works (model)" if ehw else "leader only") + f", follow: {follow}"
            b.plot([r["lifetime_min"] for r in pts], [r["tokens_per_second"] / calm for r in pts],
                   ("s" if ehw else "o") + ("-" if follow == "sums" else ":"), label=label)
    b.set_xscale("log")
    b.set_ylim(0, 1.05)
    b.set_xlabel("mean peer lifetime (min)")
    b.set_ylabel("goodput / goodput without churn")
    b.set_title(f"{m['churn_peers']} peers, {churn[0]['codec'] if churn else ''}, {m['churn_minutes']:g} min "
                f"simulated, replacement after {m['rejoin_s']:g} s", fontsize=9)
    b.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
