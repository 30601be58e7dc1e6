"""`swarm bench throughput|convergence|record`: each bench's subcommand, its flags and what runs it; the bench
module is imported only when it runs, so that `swarm --help` stays fast."""
from __future__ import annotations

import argparse

from protocol.spec import CODECS
from swarm.bench.common.flags import Subcommand, add_common, add_data, add_dtype, add_link, add_preset

from .variants import DEFAULT_VARIANTS, VARIANTS, check_variants


def _add_throughput(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("throughput", help="tokens/s of local swarms per codec, unlimited vs limited links",
                       description="Tokens/s of whole local swarms (one process per stage) per codec, unlimited "
                       "and on limited links, against each run's roofline; writes throughput.json and a PNG.")
    add_common(p)
    add_preset(p, "small")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default: 20)")
    p.add_argument("--stages", type=int, help="pipeline stages (default: the preset's)")
    add_dtype(p, None)
    p.add_argument("--devices", help="comma-separated devices, one per peer in turn, e.g. cuda:0,cuda:1 "
                   "(default: --device for every peer)")
    p.add_argument("--codecs", help=f"comma-separated codecs to run (default: {','.join(CODECS)})")
    add_link(p, "the limited links, comma-separated, e.g. 8mbit,80mbit")
    p.add_argument("--kernel-shaping", action="store_true",
                   help="also run each limited link with every process in its own network namespace and tc tbf "
                   "on its uplink and downlink (needs root; skipped with a message where not allowed) (default: off)")
    p.add_argument("--send-order", default="fifo",
                   help="comma-separated: how each peer's activations and gradients share its uplink (`swarm peer "
                   "--send-order`); fifo,shared runs every swarm both ways, side by side (default: fifo)")
    return p


def _add_convergence(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("convergence", help="held-out loss vs tokens: fixed U vs re-fitted U vs dense",
                       description="Held-out loss against tokens for the subspace codec with a fixed and a re-fitted "
                       "basis, dense and bottleneck, trained side by side; with throughput results, held-out loss "
                       "against wall-clock time on a limited link (time_to_loss.json).")
    add_common(p)
    add_preset(p, "small")
    p.add_argument("--steps", type=int, default=2000, help="steps per curve (default: 2000)")
    add_dtype(p, None)
    add_data(p)
    p.add_argument("--throughput-json", metavar="FILE",
                   help="throughput results for the time-to-loss plot (default: OUT/throughput.json)")
    p.add_argument("--link", help="the limited link of the time-to-loss plot, e.g. 80mbit "
                   "(default: the throughput results' first)")
    p.add_argument("--curves-json", metavar="FILE",
                   help="take the loss curves from this convergence.json instead of training (default: train)")
    p.add_argument("--constrained-stage-lr", type=float, metavar="X",
                   help="the subspace curves' stage lr (as on swarm local); 1 is the published method, which "
                   "docs/benchmarks.md's rows ran (default: the preset's)")
    return p


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    if not parts or set(parts) - {"curves", "throughput"}:
        raise argparse.ArgumentTypeError(f"{text!r}: name curves, throughput or both (curves,throughput).")
    return parts


def _variants(text: str) -> tuple[str, ...]:
    try:
        return check_variants(tuple(n.strip() for n in text.split(",") if n.strip()))
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _add_record(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("record", help="the public slow-link record's setting: time to dense's loss per codec",
                       description="The setting of the public record on slow links (Pluralis' ProtocolNanoGPT: "
                       "~203M parameters, d=1024, 8 stages, 200 Mbit/s and 50 ms per link) on our data: the record "
                       "preset trained with dense, subspace (k=10, ~100x), bottleneck and subspace with its "
                       "constrained stages at 0.03 x the lr (at ~100x and at 16x) side by side to a token "
                       "budget (convergence.json), each codec's tokens/s measured as a real local swarm on the "
                       "shaped link (throughput.json), and the time to dense's final held-out loss per variant, "
                       "with the steps and tokens/s ratios that bound it; writes record.json and record.png.")
    add_common(p)
    p.add_argument("--tokens", type=int, default=12_000_000, help="dense's token budget (default: 12000000)")
    p.add_argument("--codec-tokens", type=float, default=1.0, metavar="X",
                   help="train every variant but dense for X times dense's tokens, so they can reach its final "
                   "loss (default: 1.0)")
    p.add_argument("--devices", help="comma-separated devices, one per swarm peer in turn (default: --device)")
    p.add_argument("--steps", type=int, default=8, help="steps per throughput run, the first untimed (default: 8)")
    p.add_argument("--bandwidth", default="200mbit", help="every host's link (default: 200mbit)")
    p.add_argument("--latency", default="50ms", help="one-way latency per link (default: 50ms)")
    p.add_argument("--parts", type=_parts, default=("curves", "throughput"), metavar="PART[,PART]",
                   help="which parts to run: curves (training), throughput (the swarms) (default: both)")
    p.add_argument("--variants", type=_variants, default=None, metavar="NAME[,NAME]",
                   help=f"what to train and measure, dense among them: {', '.join(VARIANTS)}; a variant ending in "
                   "-lr0.03 trains its stages before the last at 0.03 x the lr and has the tokens/s of the same codec "
                   f"and width (default: {','.join(DEFAULT_VARIANTS)})")
    p.add_argument("--resume", action="store_true", help="keep OUT/convergence.json's curves trained with the same "
                   "spec and OUT/throughput.json's swarms on the same preset, link and latency; run only the rest "
                   "(default: off)")
    add_data(p)
    return p


def _throughput(a: argparse.Namespace) -> None:
    from .throughput import run_throughput_bench
    run_throughput_bench(a.out, preset_name=a.preset, steps=a.steps, bandwidth=a.bandwidth,
                         latency=a.latency, device=a.device, smoke=a.smoke, devices=a.devices, dtype=a.dtype,
                         kernel_shaping=a.kernel_shaping, stages=a.stages, codecs=a.codecs,
                         send_orders=a.send_order)


def _convergence(a: argparse.Namespace) -> None:
    from .convergence import run_convergence_bench
    run_convergence_bench(a.out, preset_name=a.preset, steps=a.steps, data=a.data, device=a.device,
                          smoke=a.smoke, throughput_json=a.throughput_json, link=a.link,
                          curves_json=a.curves_json, dtype=a.dtype, stage_lr=a.constrained_stage_lr)


def _record(a: argparse.Namespace) -> None:
    from .bench import run_record_bench
    run_record_bench(a.out, tokens=a.tokens, data=a.data, device=a.device, devices=a.devices,
                     bandwidth=a.bandwidth, latency=a.latency, steps=a.steps, codec_tokens=a.codec_tokens,
                     resume=a.resume, parts=a.parts, smoke=a.smoke, variants=a.variants)


# the room's benches by name (swarm/bench/cli.py registers them)
BENCHES: dict[str, Subcommand] = {
    "throughput": Subcommand(_add_throughput, _throughput),
    "convergence": Subcommand(_add_convergence, _convergence),
    "record": Subcommand(_add_record, _record),
}
