"""`swarm bench throughput`: tokens/s of real local swarms per codec, unlimited vs a shaped link.

Each configuration is a full `swarm local` run (separate processes over libp2p). All are run
in one invocation, side by side, and the figures that matter are ratios between them:
how much each codec slows down when the link is limited, and how compressed codecs compare
with dense on the same limited link. Absolute tokens/s mean something only on a GPU.
"""
from __future__ import annotations

import json
from pathlib import Path

from protocol.spec import preset
from swarm.local import LocalOptions, run_local

CODECS = ("dense", "subspace", "bottleneck")


def run_throughput_bench(out_dir: str, preset_name: str = "small", steps: int = 20, bandwidth: str = "80mbit",
                         latency: str = "0", device: str = "cpu", smoke: bool = False) -> dict:
    codecs = CODECS[:2] if smoke else CODECS  # smoke: dense and subspace, enough to exercise it all
    if smoke:
        preset_name, steps = "tiny", 3
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for link in (None, bandwidth):
        for codec in codecs:
            spec = preset(preset_name, codec=codec)
            m = run_local(LocalOptions(spec, steps=steps, bandwidth=link, latency=latency if link else "0",
                                       device=device, quiet=True))
            row = {"codec": codec, "bandwidth": link or "unlimited", "tokens_per_second": m["tokens_per_second"],
                   "forward_bytes_per_token": m["wire"]["forward_bytes_per_token"],
                   "dense_forward_bytes_per_token": m["wire"]["dense_forward_bytes_per_token"],
                   "final_loss": m["steps"][-1]["loss"], "steps": steps}
            runs.append(row)
            print(f"{codec:>10} {row['bandwidth']:>9}: {row['tokens_per_second']:9.0f} tok/s, "
                  f"{row['forward_bytes_per_token']:8.1f} B/token forward")
    tps = {(r["codec"], r["bandwidth"]): r["tokens_per_second"] for r in runs}
    limited = bandwidth
    ratios = {f"{c}_limited_over_unlimited": tps[(c, limited)] / tps[(c, "unlimited")] for c in codecs}
    ratios.update({f"{c}_over_dense_limited": tps[(c, limited)] / tps[("dense", limited)] for c in codecs[1:]})
    result = {"preset": preset_name, "device": device, "latency": latency, "runs": runs, "ratios": ratios}
    (out / "throughput.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "throughput.png", limited, codecs)
    for k, v in ratios.items():
        print(f"{k}: {v:.2f}")
    return result


def _plot(result: dict, path: Path, limited: str, codecs: tuple[str, ...]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.38
    for i, link in enumerate(("unlimited", limited)):
        vals = [next(r["tokens_per_second"] for r in result["runs"] if r["codec"] == c and r["bandwidth"] == link)
                for c in codecs]
        ax.bar([x + (i - 0.5) * width for x in range(len(codecs))], vals, width, label=link)
    ax.set_xticks(range(len(codecs)), codecs)
    ax.set_ylabel("tokens / s")
    ax.set_title(f"swarm throughput, {result['preset']} preset on {result['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
