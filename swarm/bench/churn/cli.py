"""`swarm bench churn`: its subcommand, its flags and what runs it; the bench module is imported only when it
runs, so that `swarm --help` stays fast."""
from __future__ import annotations

import argparse

from swarm.bench.common.flags import Subcommand, add_common, add_preset


def _add_churn(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("churn", help="a swarm whose peers are killed and replaced all the time",
                       description="Peer hosts in network namespaces (tc tbf on each uplink and downlink; needs "
                       "root), every peer joining with --stage auto; the swarm trains without churn for "
                       "--baseline-minutes, then for --minutes one peer is killed with SIGKILL every --period "
                       "seconds (the leading head every --leader-every-th time) and a fresh peer starts on a "
                       "fresh host. Reports goodput against the calm phase, the longest gap between steps, "
                       "lost, doubled and re-driven steps, stage resets, rollbacks and the steps they cost, "
                       "replica agreement (checkpoint hashes) and failover times; writes churn.json and a PNG.")
    add_common(p)
    add_preset(p, "tiny")
    p.add_argument("--hosts", type=int, default=6, help="peer hosts at any time (default: 6)")
    p.add_argument("--replicas", type=int, default=2,
                   help="replicas per stage: the run has hosts / replicas stages (default: 2)")
    p.add_argument("--period", type=float, default=60.0, metavar="S", help="seconds between kills (default: 60)")
    p.add_argument("--minutes", type=float, default=15.0, help="length of the churn phase (default: 15)")
    p.add_argument("--leader-every", type=int, default=5, metavar="K",
                   help="every K-th kill takes the leading head; 0: every kill is random (default: 5)")
    p.add_argument("--bandwidth", default="50mbit", help="every host's uplink and downlink (tc tbf) (default: 50mbit)")
    p.add_argument("--baseline-minutes", type=float, default=5.0,
                   help="minutes without churn first (longer until 2 steps are done), whose steps/min the "
                        "goodput is compared with (default: 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random choice of victims (default: 0)")
    p.add_argument("--checkpoint-every", type=int, default=10,
                   help="steps between the checkpoints each peer writes, whose hashes compare replicas (default: 10)")
    p.add_argument("--peer-args", default="", metavar="ARGS",
                   help="more flags for every `swarm peer`, e.g. --peer-args='--ttl 6' (default: none)")
    p.add_argument("--coordinator-args", default="", metavar="ARGS",
                   help="more flags for `swarm coordinator` (and every standby), e.g. "
                   "--coordinator-args='--checkpoint-dir DIR' (default: none)")
    p.add_argument("--coordinator-kills", type=int, default=0, metavar="N",
                   help="also start a standby coordinator (same key, a host and state folder of its own) and kill "
                   "the active one (read from the coordinators' seat lines) with SIGKILL N times during the churn, "
                   "at (i + 1/2) / N of it; each killed one starts again as a standby once another holds the seat. "
                   "Reports each failover (from the kill to the new holder's 'holds the seat' line), the steps "
                   "during it and the basis versions the new holder published (default: 0, no coordinator kill)")
    return p


def _churn(a: argparse.Namespace) -> None:
    from .bench import run_churn_bench
    run_churn_bench(a.out, preset_name=a.preset, hosts=a.hosts, replicas=a.replicas, period=a.period,
                    minutes=a.minutes, leader_every=a.leader_every, bandwidth=a.bandwidth,
                    baseline_minutes=a.baseline_minutes, seed=a.seed, checkpoint_every=a.checkpoint_every,
                    peer_args=a.peer_args, coordinator_args=a.coordinator_args, device=a.device,
                    smoke=a.smoke, coordinator_kills=a.coordinator_kills)


# the room's benches by name (swarm/bench/cli.py registers them)
BENCHES: dict[str, Subcommand] = {"churn": Subcommand(_add_churn, _churn)}
