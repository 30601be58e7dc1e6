"""`swarm bench replicas|replica-sync|verify|share-tolerance`: each bench's subcommand, its flags and what runs
it; the bench module is imported only when it runs, so that `swarm --help` stays fast."""
from __future__ import annotations

import argparse

from swarm.bench.common.flags import (
    Subcommand,
    add_common,
    add_data,
    add_dtype,
    add_link,
    add_preset,
    ranks_list,
    steps_list,
)


def _add_replicas(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("replicas", help="tokens/s with 1-3 replicas per stage, and failover time",
                       description="Tokens/s of local swarms with 1, 2 and 3 replicas per stage, and the seconds "
                       "from a replica's death to the next completed step; writes replicas.json and a PNG.")
    add_common(p)
    add_preset(p, "small")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default: 20)")
    return p


def _add_replica_sync(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("replica-sync", help="bytes, tokens/s and held-out loss per replica-sync mode",
                       description="Per replica-sync mode (exact, powersgd at each --sync-rank): bytes per replica "
                       "per step, tokens/s with 2 replicas per stage at --bandwidth, and held-out loss at equal "
                       "tokens; writes replica_sync.json and a PNG.")
    add_common(p)
    add_preset(p, "small")
    p.add_argument("--steps", type=int, default=300, help="steps of each loss run (default: 300)")
    p.add_argument("--sync-rank", type=ranks_list, default=(8, 32), metavar="R[,R...]",
                   help="powersgd rank(s) r to compare with exact (default: 8,32)")
    p.add_argument("--sync-warmup", type=steps_list, default=(0,), metavar="N[,N...]",
                   help="powersgd runs after each of these numbers of exact steps, e.g. 0,100 (default: 0)")
    p.add_argument("--seeds", type=int, default=1, help="loss runs per mode, seeds +0..N-1 (default: 1)")
    p.add_argument("--lr", type=float, help="learning rate (default: the preset's)")
    add_link(p, "every host's link")
    add_data(p)
    return p


def _add_verify(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("verify", help="what spot checks of replicas' work cost in tokens/s and bytes",
                       description="An in-memory swarm (one head, --replicas replicas of every other stage, each "
                       "host's uplink shaped to --bandwidth) trained at spot-check rates 0, 1/16 and 1, interleaved "
                       "over --repeats rounds: tokens/s and its ratio to no checks, shares recomputed and input "
                       "bytes fetched per step; writes verify.json and a PNG.")
    add_common(p)
    add_preset(p, "tiny")
    p.add_argument("--stages", type=int, default=3, help="pipeline stages (default: 3)")
    p.add_argument("--replicas", type=int, default=3, help="replicas of every stage but the head's (default: 3)")
    p.add_argument("--steps", type=int, default=12, help="steps per run, the first untimed (default: 12)")
    p.add_argument("--repeats", type=int, default=2, help="rounds over the three rates (default: 2)")
    add_dtype(p, "auto")
    add_link(p, "every host's uplink (unlimited: no shaping)")
    add_data(p)
    return p


def _add_share_tolerance(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("share-tolerance", help="how far honest recomputations of a replica's share fall apart; "
                       "with --liar-steps, what a liar just under the tolerance does to a run",
                       description="One replica's share of a step (a stage's gradient over its microbatches) "
                       "computed the replica's way, recomputed as a spot check does, with other attention and "
                       "matmul kernels, and on the CPU in the run's dtype and in fp32, from the same state and "
                       "boundary messages; each scored ||a - b|| / ||a|| against the recomputation, beside three "
                       "lies (x -50, another share, random of the honest norm); writes share_tolerance.json. "
                       "With --liar-steps N instead: N steps of one preset (fp32, CPU) trained honestly, with honest "
                       "noise-floor runs (another data order, other initial weights), and with one replica of every "
                       "stage after the head sending on every step a lie at 0.99 x a tolerance (each of --liars); "
                       "the weights' distance from the honest run per stage and the held-out loss every "
                       "--eval-every steps; writes under_tolerance.json and a PNG.")
    add_common(p)
    p.add_argument("--presets", help="comma-separated presets (default: tiny,small; with --liar-steps one, "
                   "default tiny)")
    p.add_argument("--codecs", help="comma-separated codecs (default: subspace,dense; with --liar-steps one, "
                   "default subspace)")
    add_dtype(p, "auto")
    p.add_argument("--warm-steps", type=int, default=20, help="steps trained before the measured ones (default: 20)")
    p.add_argument("--steps", type=int, default=2, help="steps whose shares are measured (default: 2)")
    p.add_argument("--replicas", type=int, help="shares a step's microbatches are dealt to (default: 3; with "
                   "--liar-steps: replicas of every stage, at most the preset's microbatches a step, default 2)")
    add_data(p)
    g = p.add_argument_group("a liar under the tolerance (--liar-steps)")
    g.add_argument("--liar-steps", type=int, default=0, metavar="N",
                   help="train N steps with liars just under the tolerance instead; 2000 for the measurement "
                   "(default: 0, off)")
    g.add_argument("--liars", default="fp32,bf16", metavar="TOL[:SHAPE],...",
                   help="the lies, each at 0.99 x a dtype's tolerance (fp32 1e-4, bf16 2e-2): TOL alone is every "
                   "shape, TOL:SHAPE one; shapes: scale ((1 + e) x the share), fixed (a fixed random direction), "
                   "grow (against sign(W): weights grow), drag (against the optimizer's momentum); e.g. "
                   "bf16,fp32:drag (default: fp32,bf16)")
    g.add_argument("--noise", default="data,model", metavar="KIND[+N],...", help="honest noise-floor runs: "
                   "data (the data order's seed + N, 1 if not given), model (the weights' seed + N); "
                   "comma-separated, e.g. data,model,data+2 (default: data,model)")
    g.add_argument("--eval-every", type=int, default=50, help="steps between evaluations (default: 50)")
    g.add_argument("--workers", type=int, default=1, help="processes training the runs side by side, one thread "
                   "each (default: 1)")
    g.add_argument("--cache", metavar="DIR", help="keep every run (JSON and weights) here as it ends; a run found "
                   "here is not trained again: a killed bench resumes, one with other --liars reuses the honest runs "
                   "(default: a temporary folder)")
    return p


def _replicas(a: argparse.Namespace) -> None:
    from .bench import run_replicas_bench
    run_replicas_bench(a.out, preset_name=a.preset, steps=a.steps, device=a.device, smoke=a.smoke)


def _replica_sync(a: argparse.Namespace) -> None:
    from .replica_sync import run_replica_sync_bench
    run_replica_sync_bench(a.out, preset_name=a.preset, steps=a.steps, ranks=a.sync_rank,
                           bandwidth=a.bandwidth, latency=a.latency, device=a.device, data=a.data,
                           seeds=a.seeds, lr=a.lr, smoke=a.smoke, warmups=a.sync_warmup)


def _verify(a: argparse.Namespace) -> None:
    from .verify import run_verify_bench
    run_verify_bench(a.out, preset_name=a.preset, steps=a.steps, replicas=a.replicas, repeats=a.repeats,
                     device=a.device, data=a.data, bandwidth=a.bandwidth, latency=a.latency, stages=a.stages,
                     dtype=a.dtype, smoke=a.smoke)


def _names(text: str | None, default: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or default).split(",") if x.strip())


def _share_tolerance(a: argparse.Namespace) -> None:
    if a.liar_steps:
        return _under_tolerance(a)
    from .share_tolerance import run_share_tolerance_bench
    run_share_tolerance_bench(a.out, presets=_names(a.presets, "tiny,small"), codecs=_names(a.codecs, "subspace,dense"),
                              device=a.device, dtype=a.dtype, warm_steps=a.warm_steps, steps=a.steps,
                              replicas=a.replicas or 3, data=a.data, smoke=a.smoke)


def _under_tolerance(a: argparse.Namespace) -> None:
    presets, codecs = _names(a.presets, "tiny"), _names(a.codecs, "subspace")
    if len(presets) != 1 or len(codecs) != 1:
        raise SystemExit("--liar-steps trains one preset and one codec: give one of each.")
    if a.device != "cpu" or a.dtype not in ("fp32", None):
        raise SystemExit("--liar-steps trains fp32 on the CPU (bf16's tolerance is applied to an fp32 run).")
    from .under_tolerance import parse_liars, parse_noise, run_under_tolerance_bench
    try:
        liars, noise = parse_liars(a.liars), parse_noise(a.noise)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    run_under_tolerance_bench(a.out, preset_name=presets[0], codec=codecs[0], steps=a.liar_steps,
                              replicas=a.replicas or 2, liars=liars, noise=noise, data=a.data,
                              eval_every=a.eval_every, workers=a.workers, cache=a.cache)


# the room's benches by name (swarm/bench/cli.py registers them)
BENCHES: dict[str, Subcommand] = {
    "replicas": Subcommand(_add_replicas, _replicas),
    "replica-sync": Subcommand(_add_replica_sync, _replica_sync),
    "verify": Subcommand(_add_verify, _verify),
    "share-tolerance": Subcommand(_add_share_tolerance, _share_tolerance),
}
