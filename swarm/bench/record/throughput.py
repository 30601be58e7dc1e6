"""`swarm bench throughput`: tokens/s of real local swarms per codec, against each one's roofline.

Each configuration is a full `swarm local` run (separate processes over libp2p), all in one
invocation, side by side. Per codec: one unshaped run, whose tokens/s is the codec's compute
ceiling C; then per bandwidth B (`--bandwidth 8mbit,80mbit`) one run with the built-in shaper
(`HomeLink`: each peer's one uplink and one downlink, shared by all its traffic, plus
`--latency`) and, with `--kernel-shaping`, the same run with every process in its own network
namespace and tc's tbf on each host's uplink and downlink (swarm/net/namespaces.py; latency,
if any, still comes from the built-in shaper, as netem is not in every kernel).

Roofline of a codec on a link: min(C, (B / 8) / b), with b the most bytes any peer sends per
token it processes (every frame: activations, gradients, acknowledgements; counted in that
run). Reported per run: tokens/s, the roofline and the ratio, each peer's bytes per token and
uplink busy fraction (time its uplink was transmitting over the training time: from the
built-in shaper's buckets, or from the kernel qdiscs' byte counters, headers included).
Absolute tokens/s mean something only on the machine named in the JSON.
"""
from __future__ import annotations

import json
from pathlib import Path

from protocol.spec import RunSpec, preset
from swarm.bench.common.machine import devices_used, machine_info
from swarm.local import LocalOptions, run_local
from swarm.net.namespaces import KernelLinks, KernelShapingUnavailable
from swarm.net.shaper import parse_bandwidth

from .time_to_loss import variant_of

CODECS = ("dense", "subspace", "bottleneck")
SEND_ORDERS = ("fifo", "shared")  # swarm peer --send-order


def _process_names(spec: RunSpec) -> list[str]:
    return ["coordinator"] + [f"stage{s}" for s in range(spec.n_stages)]


def kernel_shaping_problem() -> str | None:
    """None if namespaces, veths and tbf can be made here, else the reason (one sentence)."""
    try:
        KernelLinks(["probe"], "8mbit").up().down()
    except KernelShapingUnavailable as e:
        return str(e)
    return None


def _one_run(spec: RunSpec, steps: int, link: str | None, latency: str, shaping: str, device: str,
             devices: str | None, variant: str | None = None, send_order: str = "fifo") -> dict:
    opts = LocalOptions(spec, steps=steps, bandwidth=link if shaping == "builtin" else None,
                        latency=latency if link else "0", device=device, devices=devices, quiet=True,
                        extra_peer_args=["--send-order", send_order])
    kernel = None
    if shaping == "kernel":
        with KernelLinks(_process_names(spec), link) as links:
            m = run_local(opts, placement=links)
            kernel = links.stats()
    else:
        m = run_local(opts)
    seconds = sum(s["seconds"] for s in m["steps"])
    peers = []
    for p in m["peers"]:
        row = {"stage": p["stage"], "bytes_sent_per_token": p.get("bytes_sent_per_token")}
        if kernel is not None:
            row["uplink_busy_fraction"] = kernel[f"stage{p['stage']}"]["uplink_busy_s"] / max(seconds, 1e-9)
            row["kernel_uplink_bytes"] = kernel[f"stage{p['stage']}"]["uplink_bytes"]
        elif "uplink_busy_fraction" in p:
            row["uplink_busy_fraction"] = p["uplink_busy_fraction"]
        peers.append(row)
    return {"codec": spec.codec, "variant": variant or spec.codec, "rank": spec.rank, "bandwidth": link or "unlimited",
            "shaping": shaping, "send_order": send_order,
            "latency": opts.latency, "tokens_per_second": m["tokens_per_second"],
            "forward_bytes_per_token": m["wire"]["forward_bytes_per_token"],
            "dense_forward_bytes_per_token": m["wire"]["dense_forward_bytes_per_token"],
            "final_loss": m["steps"][-1]["loss"], "steps": steps, "peers": peers}


def roofline(ceiling: float, bandwidth: str, peers: list[dict]) -> float:
    """min(C, (B / 8) / b): b the most bytes per token any peer sends."""
    bps = parse_bandwidth(bandwidth)
    worst = max((p["bytes_sent_per_token"] or 0.0) for p in peers) if peers else 0.0
    if bps is None or worst <= 0:
        return ceiling
    return min(ceiling, bps / 8 / worst)


def run_throughput_bench(out_dir: str, preset_name: str = "small", steps: int = 20, bandwidth: str = "80mbit",
                         latency: str = "0", device: str = "cpu", smoke: bool = False, devices: str | None = None,
                         dtype: str | None = None, kernel_shaping: bool = False, stages: int | None = None,
                         codecs: str | None = None, ceiling: bool = True,
                         variants: dict[str, RunSpec] | None = None, send_orders: str = "fifo") -> dict:
    """`ceiling=False` skips each codec's unshaped run: the rooflines are then the link's alone.
    `variants` (name -> spec) replaces the preset's codecs: one swarm per variant, its rows keyed
    by that name ("variant"), e.g. a codec at another rank. `send_orders` ("fifo", "shared" or both,
    comma-separated): each variant runs with each, one after the other; a variant run "shared" beside
    "fifo" is named "<variant>/shared" (`swarm peer --send-order`)."""
    chosen = tuple(c.strip() for c in codecs.split(",")) if codecs else CODECS
    unknown = [c for c in chosen if c not in CODECS]
    if unknown:
        raise ValueError(f"--codecs takes {', '.join(CODECS)}, not {', '.join(unknown)}.")
    if smoke:
        preset_name, steps = "tiny", 3
    orders = [o.strip() for o in send_orders.split(",")]
    if any(o not in SEND_ORDERS for o in orders) or len(set(orders)) < len(orders):
        raise ValueError(f"--send-order takes {' or '.join(SEND_ORDERS)}, or both comma-separated, "
                         f"not {send_orders!r}.")
    orders.sort(key=SEND_ORDERS.index)  # fifo first: the twin run is "<variant>/shared"
    if variants is None:  # smoke: two codecs, enough to exercise it all
        variants = {c: preset(preset_name, codec=c, dtype=dtype, stages=stages) for c in chosen[:2 if smoke else None]}
    runs_of = [(name if order == orders[0] else f"{name}/{order}", spec, order)
               for name, spec in variants.items() for order in orders]
    codecs = tuple(name for name, _, _ in runs_of)
    bandwidths = [b.strip() for b in bandwidth.split(",")]
    for b in bandwidths:
        if parse_bandwidth(b) is None:
            raise ValueError(f"--bandwidth {b!r} is unlimited; name the limited links, e.g. 8mbit,80mbit.")
    shapings = ["builtin"]
    kernel_note = None
    if kernel_shaping:
        kernel_note = kernel_shaping_problem()
        if kernel_note is None:
            shapings.append("kernel")
        else:
            print(f"skipping kernel shaping: {kernel_note}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, spec, order in runs_of:
        top = float("inf")
        if ceiling:
            base = _one_run(spec, steps, None, "0", "none", device, devices, name, order)
            top = base["tokens_per_second"]
            base.update(roofline_tokens_per_second=top, of_roofline=1.0)
            runs.append(base)
            _print(base)
        for b in bandwidths:
            for shaping in shapings:
                row = _one_run(spec, steps, b, latency, shaping, device, devices, name, order)
                row["roofline_tokens_per_second"] = roofline(top, b, row["peers"])
                row["of_roofline"] = row["tokens_per_second"] / row["roofline_tokens_per_second"]
                runs.append(row)
                _print(row)
        partial = throughput_record(preset_name, spec, device, devices, latency, bandwidths, kernel_shaping,
                                    kernel_note, runs, {})
        (out / "throughput.json").write_text(json.dumps(partial, indent=1) + "\n")  # kept if a later swarm fails
    result = throughput_record(preset_name, spec, device, devices, latency, bandwidths, kernel_shaping, kernel_note,
                               runs, throughput_ratios(runs, codecs, bandwidths))
    (out / "throughput.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "throughput.png", codecs)
    for k, v in result["ratios"].items():
        print(f"{k}: {v:.2f}")
    return result


def throughput_record(preset_name: str, spec: RunSpec, device: str, devices: str | None, latency: str,
                      bandwidths: list[str], kernel_shaping: bool, kernel_note: str | None, runs: list[dict],
                      ratios: dict[str, float]) -> dict:
    """The JSON of a throughput bench: "device" names every device the peers used (--devices when
    given, else --device), "devices" lists them, and "machine" says what machine that was."""
    used = devices_used(device, devices)
    return {"preset": preset_name, "stages": spec.n_stages, "device": ",".join(used), "devices": used,
            "dtype": spec.dtype, "machine": machine_info(used), "latency": latency, "bandwidths": bandwidths,
            "kernel_shaping": kernel_shaping, "kernel_shaping_skipped": kernel_note, "runs": runs, "ratios": ratios}


def merge_throughput(new: dict, earlier_runs: list[dict], out: Path) -> dict:
    """`new` (a throughput bench's result) with the runs of an earlier one of the same preset,
    link and latency first, its ratios over all of them; rewrites OUT/throughput.json and its plot."""
    runs = earlier_runs + new["runs"]
    names = tuple(dict.fromkeys(map(variant_of, runs)))
    result = {**new, "runs": runs, "ratios": throughput_ratios(runs, names, new["bandwidths"]),
              "reused_runs": list(dict.fromkeys(map(variant_of, earlier_runs)))}
    (out / "throughput.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "throughput.png", names)
    return result


def throughput_ratios(runs: list[dict], codecs: tuple[str, ...], bandwidths: list[str]) -> dict[str, float]:
    """Each variant on the first limited link over unlimited and over dense, kernel over built-in, and
    sends in order over shared (a variant beside its "/shared" twin) on each limited link."""
    tps = {(variant_of(r), r["bandwidth"], r["shaping"]): r["tokens_per_second"] for r in runs}
    first = bandwidths[0]
    ratios = {f"{c}_limited_over_unlimited": tps[(c, first, "builtin")] / tps[(c, "unlimited", "none")]
              for c in codecs if (c, "unlimited", "none") in tps}
    if ("dense", first, "builtin") in tps:  # dense may run in another invocation (--codecs)
        ratios.update({f"{c}_over_dense_limited": tps[(c, first, "builtin")] / tps[("dense", first, "builtin")]
                       for c in codecs if c != "dense"})
    for c in codecs:
        for b in bandwidths:
            if (c, b, "builtin") in tps and (f"{c}/shared", b, "builtin") in tps:
                ratios[f"{c}_{b}_fifo_over_shared"] = tps[(c, b, "builtin")] / tps[(f"{c}/shared", b, "builtin")]
            if (c, b, "kernel") in tps:
                ratios[f"{c}_{b}_kernel_over_builtin"] = tps[(c, b, "kernel")] / tps[(c, b, "builtin")]
    return ratios


def _print(row: dict) -> None:
    link = row["bandwidth"] if row["shaping"] == "none" else f"{row['bandwidth']} {row['shaping']}"
    busy = ", ".join(f"{p['uplink_busy_fraction']:.2f}" for p in row["peers"] if "uplink_busy_fraction" in p)
    print(f"{variant_of(row):>10} {link:>16}: {row['tokens_per_second']:9.0f} tok/s "
          f"({row['of_roofline']:.2f} of roofline {row['roofline_tokens_per_second']:.0f}), "
          f"{row['forward_bytes_per_token']:8.1f} B/token forward" + (f", uplinks busy {busy}" if busy else ""),
          flush=True)


def _plot(result: dict, path: Path, codecs: tuple[str, ...]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = [("unlimited", "none")] * any(r["shaping"] == "none" for r in result["runs"])
    configs += [(b, s) for b in result["bandwidths"]
                                         for s in ("builtin", "kernel") if any(
                                             r["bandwidth"] == b and r["shaping"] == s for r in result["runs"])]
    shaped = [c for c in configs if c[1] != "none"]
    fig, ax = plt.subplots(figsize=(max(7, 2.2 * len(codecs) * len(configs) / 3), 4.5))
    width = 0.8 / len(configs)
    for i, (link, shaping) in enumerate(configs):
        rows = [next(r for r in result["runs"] if variant_of(r) == c and r["bandwidth"] == link
                     and r["shaping"] == shaping) for c in codecs]
        xs = [x + (i - (len(configs) - 1) / 2) * width for x in range(len(codecs))]
        label = link if shaping == "none" else f"{link}, {'kernel tbf' if shaping == 'kernel' else 'built-in'}"
        ax.bar(xs, [r["tokens_per_second"] for r in rows], width, label=label)
        if shaping != "none":
            ax.scatter(xs, [r["roofline_tokens_per_second"] for r in rows], marker="_", s=300, color="black",
                       zorder=3, label="roofline" if i == len(configs) - len(shaped) else None)
    ax.set_xticks(range(len(codecs)), codecs)
    ax.set_ylabel("tokens / s")
    values = [r["tokens_per_second"] for r in result["runs"]]
    if max(values) > 20 * min(values):  # e.g. dense on a slow link next to the compressed codecs
        ax.set_yscale("log")
    ax.set_title(f"swarm throughput, {result['preset']} preset on {result['device']}"
                 + (f", latency {result['latency']}" if result["latency"] not in ("0", "") else ""))
    ax.legend(fontsize=8, bbox_to_anchor=(1.01, 1), loc="upper left")  # beside the bars, never on them
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
