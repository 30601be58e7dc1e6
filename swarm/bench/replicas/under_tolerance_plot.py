"""The figure of `swarm bench share-tolerance --liar-steps` (under_tolerance.py): per stage, how far each run's
weights are from the honest run's, ||W_v - W_honest|| / ||W_honest||, against steps; and each run's held-out loss
minus the honest run's, beside the honest noise-floor runs'."""
from __future__ import annotations

from pathlib import Path

COLORS = {"scale": "tab:blue", "fixed": "tab:orange", "grow": "tab:red", "drag": "tab:purple"}
STYLES = {"bf16": "-", "fp32": "--"}


def _style(variant: dict) -> dict:
    if variant["shape"] == "none":  # the noise floor: grey; the data-seed run dotted, the weights-seed one dash-dot
        return {"color": "0.5", "ls": ":" if variant["data_offset"] else "-.", "lw": 1.2}
    return {"color": COLORS.get(variant["shape"], "k"), "ls": STYLES.get(variant["tolerance"], "-"), "lw": 1.2}


def plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["runs"][1:]  # the honest run is the reference
    n_stages = len(result["runs"][0]["points"][0]["distance"])
    fig, axes = plt.subplots(1, n_stages + 1, figsize=(4.2 * (n_stages + 1), 4.0))
    for s in range(n_stages):
        ax = axes[s]
        for run in runs:
            if run["variant"]["seed_offset"]:
                continue  # other initial weights: a distance of order 1 that says nothing about a liar
            pts = [p for p in run["points"] if p["distance"][s] > 0]
            ax.plot([p["step"] for p in pts], [p["distance"][s] for p in pts], **_style(run["variant"]))
        liar = "liar" if s in result["liar_stages"] else "no liar"
        ax.set_title(f"stage {s} ({liar}): ||W - W_honest|| / ||W_honest||", fontsize=8)
        ax.set_yscale("log")
        ax.set_xlabel("step")
    ax = axes[-1]
    honest = result["runs"][0]["points"]
    for run in runs:
        ax.plot([p["step"] for p in run["points"]],
                [p["held_out"] - h["held_out"] for p, h in zip(run["points"], honest)],
                label=run["variant"]["name"], **_style(run["variant"]))
    ax.axhline(0, color="k", lw=0.6)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_title("held-out loss - honest run's (nats)", fontsize=8)
    ax.set_xlabel("step")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    where = result.get("machine", {}).get("description", result["device"])
    fig.suptitle(f"a replica lying at {result['margin']} x the tolerance on every step: {result['preset']} "
                 f"{result['codec']}, {result['replicas']} replicas a stage, {result['steps']} steps ({where})",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
