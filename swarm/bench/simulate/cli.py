"""`swarm bench simulate`: its subcommand, its flags (the swarm's size, hardware, links and churn that the
simulation draws from) and what runs it: simulate/bench.py, with --validate simulate/validate.py, or with
--record-setting simulate/record_setting.py, imported only when it runs, so that `swarm --help` stays fast."""
from __future__ import annotations

import argparse

from protocol.spec import CODECS
from swarm.bench.common.flags import Subcommand, add_common, add_preset, ranks_list


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers.") from None


def _add_simulate(sub) -> argparse.ArgumentParser:
    from .hardware import CONSUMER, GPUS
    from .step import REDUCES
    p = sub.add_parser("simulate", help="a simulated swarm of 10-1,000 home GPUs: tokens/s against N, churn, codec",
                       description="A discrete-event simulation (virtual clock) of a swarm of N peers that runs the "
                       "project's own router and placement against modelled GPUs (a table of consumer cards at "
                       "--mfu of their bf16 rate) and home links (the built-in shaper), with churn. Reports tokens/s "
                       "against N per codec, goodput against the mean peer lifetime, and how many home GPUs match "
                       "one A100 or H100; writes simulate.json and a PNG. --validate instead runs small real local "
                       "swarms on this CPU beside the simulator calibrated to it (simulate_validation.json).")
    add_common(p, device=False)
    add_preset(p, "large")
    p.add_argument("--codecs", default=",".join(CODECS), help=f"comma-separated codecs (default: {','.join(CODECS)})")
    p.add_argument("--peers", type=ranks_list, default=(10, 30, 100, 300, 1000), metavar="N[,N...]",
                   help="swarm sizes of the tokens/s curve (default: 10,30,100,300,1000)")
    p.add_argument("--uplink", default="80", metavar="MBIT[-MBIT]",
                   help="every host's uplink in Mbit/s, or a range drawn uniformly per host, e.g. 10-200 (default: 80)")
    p.add_argument("--latency", default="10-150", metavar="MS[-MS]",
                   help="one-way latency in ms, or a range drawn uniformly per host (default: 10-150)")
    p.add_argument("--downlink-ratio", type=float, default=1.0,
                   help="downlink rate over uplink rate (1: symmetric, as swarm local shapes it) (default: 1)")
    p.add_argument("--gpus", default=",".join(CONSUMER), metavar="CARD[,CARD...]",
                   help=f"cards a peer's GPU is drawn from, uniformly; known: {', '.join(GPUS)} "
                   f"(default: the consumer ones)")
    p.add_argument("--mfu", type=float, default=0.4, help="share of a card's bf16 rate a stage sustains (default: 0.4)")
    p.add_argument("--replica-sync", default="powersgd", choices=["exact", "powersgd"],
                   help="how a stage's replicas sum their gradients (default: powersgd)")
    p.add_argument("--sync-rank", type=int, default=None, metavar="R",
                   help="powersgd's rank (default: the run spec's, 8)")
    p.add_argument("--reduce", default="all", choices=REDUCES,
                   help="how a stage's replicas exchange contributions: all (each sends every other its whole "
                   "contribution, as the swarm does) or ring (a ring all-reduce, not built: modelled) (default: all)")
    p.add_argument("--microbatches-per-replica", type=int, default=4,
                   help="the step's microbatches per replica of a stage (the batch grows with the swarm; at least "
                   "the preset's) (default: 4)")
    p.add_argument("--steps", type=int, default=8,
                   help="steps per swarm of the N curve, the first untimed (default: 8)")
    p.add_argument("--lifetimes", type=_floats, default=(float("inf"), 240.0, 60.0, 30.0, 15.0), metavar="MIN[,MIN...]",
                   help="mean peer lifetimes in minutes (exponential; inf: no churn) (default: inf,240,60,30,15)")
    p.add_argument("--churn-peers", type=int, default=100, help="swarm size of the churn curve (default: 100)")
    p.add_argument("--churn-minutes", type=float, default=120.0,
                   help="virtual minutes of each churn run (default: 120)")
    p.add_argument("--rejoin-s", type=float, default=60.0,
                   help="seconds from a peer's death to its replacement's join (default: 60)")
    p.add_argument("--every-head-works", action="store_true",
                   help="also model issue 22 item 1 (every head computes stage 0, as the swarm now does) beside the "
                   "old schedule (default: off)")
    p.add_argument("--step-timeout", type=float, default=0.0,
                   help="seconds the first step may take before the driver re-drives it (swarm peer --step-timeout); "
                   "0: none, as an operator of a big swarm would set it high enough (default: 0)")
    p.add_argument("--seed", type=int, default=0, help="seed of every draw (GPUs, links, lifetimes) (default: 0)")
    p.add_argument("--follow", default="sums", metavar="MODEL[,MODEL]",
                   help="what a replacement's donor forwards it per step while it catches up, for the churn curve: "
                   "sums (the reduce's factor sums, as the swarm does), whole (the stage's whole gradient, as before "
                   "2026-12-01), or both (default: sums)")
    p.add_argument("--validate", action="store_true",
                   help="run real local swarms (tiny, CPU, shaped links) and the simulator calibrated to this CPU, "
                   "and write the table of both (default: off)")
    p.add_argument("--record-setting", action="store_true",
                   help="the public record's setting instead (8 stages of the record preset, 200 Mbit/s, 50 ms): "
                   "each swarm of `swarm bench record` calibrated and run for real on --device, unshaped and on the "
                   "link, beside the simulator's prediction for that machine (simulate_record.json) (default: off)")
    p.add_argument("--device", default="cpu",
                   help="--record-setting: torch device of the real swarms and their calibration (default: cpu)")
    p.add_argument("--record-variants", default=None, metavar="NAME[,NAME...]",
                   help="--record-setting: `swarm bench record` variants whose swarms to run (one per codec and "
                   "width; dense among them) (default: the record bench's: dense, subspace, bottleneck, subspace-16x)")
    p.add_argument("--measured", default=None, metavar="FILE",
                   help="--record-setting: a record_measured.json written earlier; its swarms are not run again "
                   "(all there: the prediction alone) (default: none)")
    p.add_argument("--published", default=None, metavar="FILE",
                   help="--record-setting: a `swarm bench record` throughput.json of this setting whose tokens/s are "
                   "set beside the prediction too, e.g. docs/img/record-gpu-h100-throughput.json (default: none)")
    return p


def follow_models(text: str) -> tuple[str, ...]:
    models = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    if not models or any(m not in ("sums", "whole") for m in models):
        raise ValueError(f"--follow {text!r}: give sums, whole, or sums,whole.")
    return models


def _simulate(a: argparse.Namespace) -> None:
    if a.record_setting:
        from .record_setting import run_record_setting
        names = tuple(n.strip() for n in a.record_variants.split(",")) if a.record_variants else None
        run_record_setting(a.out, device=a.device, steps=a.steps, variants=names, measured_path=a.measured,
                           published_path=a.published, smoke=a.smoke)
        return
    if a.validate:
        from .validate import run_validation
        run_validation(a.out, smoke=a.smoke)
        return
    from .bench import run_simulate_bench
    run_simulate_bench(a.out, preset_name=a.preset, codecs=tuple(c.strip() for c in a.codecs.split(",")),
                       peers=a.peers, uplink=a.uplink, latency=a.latency, downlink_ratio=a.downlink_ratio,
                       gpus=tuple(g.strip() for g in a.gpus.split(",")), mfu=a.mfu, replica_sync=a.replica_sync,
                       per_replica=a.microbatches_per_replica, steps=a.steps, lifetimes=a.lifetimes,
                       churn_peers=a.churn_peers, churn_minutes=a.churn_minutes, rejoin_s=a.rejoin_s,
                       every_head_works=a.every_head_works, seed=a.seed, step_timeout=a.step_timeout or None,
                       follows=follow_models(a.follow), sync_rank=a.sync_rank, reduce=a.reduce, smoke=a.smoke)


# the room's benches by name (swarm/bench/cli.py registers them)
BENCHES: dict[str, Subcommand] = {"simulate": Subcommand(_add_simulate, _simulate)}
