"""Time to loss: held-out loss against wall-clock time on a limited link, per codec.

The user's question is not "loss per token" nor "tokens per second" but their product: how long
until the model is this good, over home links. Both factors are measured, separately:

- loss per token: `swarm bench convergence` curves (held-out loss after t tokens, per variant);
- tokens/s: `swarm bench throughput` runs of the same preset on the link (e.g. 80mbit, the
  built-in shaper's rows unless asked otherwise), one figure per codec.

A variant of codec c reaches its held-out loss L(t) after t / tokens_per_s(c) seconds. Also
reported: the seconds each variant needs to reach the target loss, the highest final loss of
the variants (so every one gets there), by linear interpolation between evaluations.
"""
from __future__ import annotations

import json
from pathlib import Path


class TimeToLossError(ValueError):
    """The throughput figures cannot be matched to the curves; the message says what is missing."""


def variant_of(row: dict) -> str:
    """A throughput run's variant name: its codec in JSONs written before variants."""
    return row.get("variant", row["codec"])


def link_throughput(throughput: dict, bandwidth: str | None = None, shaping: str = "builtin") -> dict[str, float]:
    """Tokens/s per codec on the limited link `bandwidth` (the first limited one if None)."""
    rows = [r for r in throughput["runs"] if r["bandwidth"] != "unlimited"
            and r.get("shaping", "builtin") == shaping]
    if bandwidth is None and rows:
        bandwidth = rows[0]["bandwidth"]
    rows = [r for r in rows if r["bandwidth"] == bandwidth]
    if not rows:
        have = sorted({f"{r['bandwidth']} ({r.get('shaping', 'builtin')})" for r in throughput["runs"]})
        raise TimeToLossError(f"the throughput results have no {shaping} run at {bandwidth}; they have "
                              f"{', '.join(have)}. Run `swarm bench throughput --bandwidth {bandwidth}` first.")
    return {variant_of(r): r["tokens_per_second"] for r in rows}


def seconds_to(curve: list[list[float]], target: float) -> float | None:
    """First time a [[seconds, loss], ...] curve reaches `target`, interpolated; None if it never does."""
    prev = None
    for t, loss in curve:
        if loss <= target:
            if prev is None or prev[1] == loss:
                return t
            (t0, l0) = prev
            return t0 + (t - t0) * (l0 - target) / (l0 - loss)
        prev = (t, loss)
    return None


def time_to_loss(convergence: dict, throughput: dict, bandwidth: str | None = None,
                 shaping: str = "builtin", swarm_of: dict[str, str] | None = None) -> dict:
    """Held-out loss against seconds for every variant whose codec has a tokens/s on the link.
    `swarm_of` names the throughput variant of a curve where it is not the curve's codec (e.g. a
    codec at another rank)."""
    tps = link_throughput(throughput, bandwidth, shaping)
    link = bandwidth or next(r["bandwidth"] for r in throughput["runs"] if r["bandwidth"] != "unlimited")
    curves, missing = {}, []
    for name, c in convergence["curves"].items():
        codec = (swarm_of or {}).get(name, c["spec"]["codec"])
        if codec not in tps:
            missing.append(name)
            continue
        curves[name] = {"codec": codec, "tokens_per_second": tps[codec],
                        "val": [[tokens / tps[codec], loss] for tokens, loss in c["val"]]}
    if not curves:
        raise TimeToLossError(f"no codec of the curves ({', '.join(convergence['curves'])}) has a throughput "
                              f"at {link}.")
    target = max(c["val"][-1][1] for c in curves.values())
    for c in curves.values():
        c["seconds_to_target"] = seconds_to(c["val"], target)
    notes = []
    if throughput.get("preset") != convergence.get("preset"):
        notes.append(f"throughput measured on preset {throughput.get('preset')}, curves on {convergence.get('preset')}")
    if missing:
        notes.append(f"no throughput for {', '.join(missing)}")
    return {"bandwidth": link, "shaping": shaping, "tokens_per_second": tps, "target_loss": target,
            "throughput_device": throughput.get("device"), "curves": curves, "notes": notes}


def write_time_to_loss(result: dict, out_dir: Path, preset_name: str) -> None:
    (out_dir / "time_to_loss.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out_dir / "time_to_loss.png", preset_name)
    for name, c in result["curves"].items():
        t = c["seconds_to_target"]
        shown = f"{t / 3600:.2f} h" if t is not None else "not reached"
        print(f"{name:>22}: {c['tokens_per_second']:9.0f} tok/s at {result['bandwidth']}, loss "
              f"{result['target_loss']:.3f} after {shown}")
    for note in result["notes"]:
        print(f"note: {note}")


def _plot(result: dict, path: Path, preset_name: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, c in result["curves"].items():
        xs, ys = zip(*c["val"])
        ax.plot([x / 3600 for x in xs], ys, marker=".", label=f"{name} ({c['tokens_per_second']:.0f} tok/s)")
    ax.axhline(result["target_loss"], color="gray", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel(f"wall-clock hours at {result['bandwidth']} ({result['shaping']} shaping)")
    ax.set_ylabel("held-out loss (nats/byte)")
    ax.set_title(f"time to loss, {preset_name}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
