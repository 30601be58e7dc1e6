"""The flags of `swarm bench`: one subcommand per benchmark, each with only the flags it uses,
so that `swarm bench fidelity --help` lists fidelity's flags and nothing else. `register`
adds them to the `swarm` parser; `swarm/bench/__init__.py` runs the one chosen."""
from __future__ import annotations

import argparse

from protocol.spec import CODECS

from .cli_flags import (
    add_common,
    add_data,
    add_dtype,
    add_link,
    add_preset,
    ranks_list,
    resolve_bench_dtype,
    sizes_list,
    steps_list,
)
from .record.variants import DEFAULT_VARIANTS, VARIANTS, check_variants
from .simulate.cli import add_simulate

__all__ = ["register", "resolve_bench_dtype"]


def _add_codecs(sub) -> None:
    p = sub.add_parser("codecs", help="bytes/token and encode/decode time per codec",
                       description="Bytes per token on the wire and encode/decode time of each codec (dense, "
                       "subspace, bottleneck) at d = 512, 1024, 4096, on the CPU; writes codecs.json and a PNG.")
    add_common(p, device=False)


def _add_throughput(sub) -> None:
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


def _add_convergence(sub) -> None:
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


def _add_mfu(sub) -> None:
    p = sub.add_parser("mfu", help="the device's bf16 matmul rate and the share of it training uses",
                       description="The device's bf16 n^3 matmul rate and the share of it (MFU) that training the "
                       "whole model on that one device uses; writes mfu.json and a PNG.")
    add_common(p)
    add_preset(p, "large")
    p.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    p.add_argument("--codec", default="dense", choices=CODECS, help="codec (default: dense)")
    add_dtype(p, "auto")
    p.add_argument("--microbatch-size", type=int, help="sequences per microbatch (default: the preset's)")
    p.add_argument("--matmul-size", type=int, default=8192, help="n of the n^3 bf16 matmul (default: 8192)")
    p.add_argument("--compile", action="store_true", help="torch.compile every block (default: off)")


def _add_replicas(sub) -> None:
    p = sub.add_parser("replicas", help="tokens/s with 1-3 replicas per stage, and failover time",
                       description="Tokens/s of local swarms with 1, 2 and 3 replicas per stage, and the seconds "
                       "from a replica's death to the next completed step; writes replicas.json and a PNG.")
    add_common(p)
    add_preset(p, "small")
    p.add_argument("--steps", type=int, default=20, help="steps per run (default: 20)")


def _add_replica_sync(sub) -> None:
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


def _add_verify(sub) -> None:
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


def _add_share_tolerance(sub) -> None:
    p = sub.add_parser("share-tolerance", help="how far honest recomputations of a replica's share fall apart",
                       description="One replica's share of a step (a stage's gradient over its microbatches) "
                       "computed the replica's way, recomputed as a spot check does, with other attention and "
                       "matmul kernels, and on the CPU in the run's dtype and in fp32, from the same state and "
                       "boundary messages; each scored ||a - b|| / ||a|| against the recomputation, beside three "
                       "lies (x -50, another share, random of the honest norm); writes share_tolerance.json.")
    add_common(p)
    p.add_argument("--presets", default="tiny,small", help="comma-separated presets (default: tiny,small)")
    p.add_argument("--codecs", default="subspace,dense", help="comma-separated codecs (default: subspace,dense)")
    add_dtype(p, "auto")
    p.add_argument("--warm-steps", type=int, default=20, help="steps trained before the measured ones (default: 20)")
    p.add_argument("--steps", type=int, default=2, help="steps whose shares are measured (default: 2)")
    p.add_argument("--replicas", type=int, default=3, help="shares a step's microbatches are dealt to (default: 3)")
    add_data(p)


def _add_fidelity(sub) -> None:
    p = sub.add_parser("fidelity", help="held-out loss against compression, ablations, widths",
                       description="Held-out loss against compression, one-cause ablations of the loss gap and "
                       "dense vs subspace across widths, as jobs spread over GPUs inside a time budget "
                       "(docs/fidelity.md); writes fidelity.json, fidelity.md and a PNG.")
    add_common(p)
    p.add_argument("--plan", choices=["gpu", "cpu"], default="gpu",
                   help="gpu (bf16, the small shape, ~10 min of 4 H100s) or cpu (d=128, the reduced size of the "
                   "CPU results) (default: gpu)")
    p.add_argument("--groups", help="comma-separated job groups: scale,headline,frontier,seeds,lr,optimizer,embed,"
                   "layers,refit,hybrid (default: these), and gap,gap-seed1 (why the constrained layers add nothing: "
                   "one boundary, full-width boundaries, lr of the constrained stages; seed 0 / seed 1)")
    p.add_argument("--parallel", type=int, default=1,
                   help="GPUs to use, cuda:0..N-1 (on a CPU: worker processes) (default: 1)")
    p.add_argument("--per-device", type=int, default=1, help="worker processes per GPU (default: 1)")
    p.add_argument("--budget-s", type=float, default=540.0,
                   help="wall-clock budget in seconds; jobs that cannot finish are skipped or cut (default: 540)")
    p.add_argument("--resume", action="store_true",
                   help="keep the jobs OUT/fidelity.jsonl already holds finished and run the others (default: off)")
    p.add_argument("--best", metavar="JSON", help="RunSpec overrides for the headline's 'best settings' row, "
                   "e.g. '{\"lr\": 0.002}' (default: none)")
    p.add_argument("--dense-runs", type=_dense_runs, default=1, metavar="N",
                   help="train every dense job N times with the same spec: dense on a GPU is not bit-repeatable "
                   "(~1 point of held-out loss between identical runs), so every comparison with dense takes the "
                   "mean of the N runs (default: 1)")
    add_data(p)


def _dense_runs(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"N must be a whole number of at least 1, not {text!r}.")
    return n


def _add_churn(sub) -> None:
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
                   help="more flags for `swarm coordinator`, e.g. --coordinator-args='--checkpoint-dir DIR' "
                   "(default: none)")


def _add_memory(sub) -> None:
    p = sub.add_parser("memory", help="each stage's peak GPU memory against the estimate, and the card it fits",
                       description="Builds stages of each preset on the GPU, runs two training steps as a pipeline "
                       "stage does, and records torch.cuda.max_memory_allocated against "
                       "peer/runner/memory_estimate.py; then caps the process at 8/12/16/24/48/80 GB cards in turn "
                       "until a step fits. Writes memory.json and memory.png.")
    add_common(p, device=False)
    p.add_argument("--device", default="cuda", help="CUDA device, e.g. cuda:1 (default: cuda)")
    p.add_argument("--presets", default="small,large,xl", help="comma-separated presets (default: small,large,xl)")
    add_dtype(p, "auto")
    p.add_argument("--stages", default="ends", help="ends (the first, one middle, the last), all, or "
                   "comma-separated stage numbers (default: ends)")
    p.add_argument("--checkpointing", default="both", choices=("both", "off", "on"),
                   help="activation checkpointing per block: measure without it, with it, or both (default: both)")
    p.add_argument("--no-caps", action="store_true", help="skip the runs under card-sized memory caps (default: off)")


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


def _add_record(sub) -> None:
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


def _add_transport(sub) -> None:
    p = sub.add_parser("transport", help="MB/s of raw TCP vs the libp2p daemons vs our Transport on loopback",
                       description="The same frames moved over this machine's loopback by a raw TCP connection, "
                       "by libp2p streams between two p2pd daemons, and by our Transport (one way, and both ways "
                       "at once), interleaved over --repeats rounds: MB/s, the ratio to raw TCP, and the tokens/s "
                       "that rate carries between two stages per preset and codec; writes transport.json and a PNG.")
    add_common(p, device=False)
    p.add_argument("--sizes", type=sizes_list, default=(1, 4, 16), metavar="MB,MB",
                   help="frame sizes in MB, comma-separated (default: 1,4,16)")
    p.add_argument("--megabytes", type=int, default=192, help="MB sent per case and size (default: 192)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over the cases (default: 3)")
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"),
                   help="the wire's number size for the tokens/s caps (default: bf16)")


def _add_scale(sub) -> None:
    p = sub.add_parser("scale", help="tokens/s against GPUs: layouts of stages x replicas vs one process",
                       description="Tokens/s of local swarms laid out as STAGESxREPLICAS (1x2: two heads of one "
                       "stage, pure data parallel; 2x1: a 2-stage pipeline), their peers on --devices round robin, "
                       "beside the whole model trained in one process on the first device; the ratios to both. "
                       "Writes scale.json (resumable) and a PNG.")
    add_common(p)
    add_preset(p, "small")
    p.add_argument("--layouts", default="1x1,1x2,2x1", help="comma-separated STAGESxREPLICAS (default: 1x1,1x2,2x1)")
    p.add_argument("--devices", help="comma-separated devices the peers take in turn, e.g. cuda:0,cuda:1 "
                   "(default: --device for every peer)")
    p.add_argument("--codec", default="subspace", choices=CODECS, help="codec (default: subspace)")
    add_dtype(p, "auto")
    p.add_argument("--steps", type=int, default=20, help="steps per layout (default: 20)")
    p.add_argument("--warmup", type=int, default=3, help="first steps not timed (default: 3)")
    p.add_argument("--bandwidth", help="shape every peer's uplink and downlink, e.g. 80mbit (default: unlimited)")
    p.add_argument("--latency", default="0", help="one-way latency on shaped links, e.g. 20ms (default: 0)")
    p.add_argument("--replica-sync", default="exact", choices=("exact", "powersgd"),
                   help="how replicas of a stage keep in step (default: exact)")
    p.add_argument("--no-baseline", action="store_true", help="skip the one-process run (default: run it)")
    p.add_argument("--batch-size", type=int, help="sequences per step, a multiple of the preset's microbatch "
                   "(default: the preset's)")
    p.add_argument("--microbatches-in-flight", type=int, default=0, metavar="N",
                   help="a head's microbatches between forward and gradient at once; bounds saved activations "
                   "(default: 0, all of its share)")
    p.add_argument("--resume", action="store_true", help="keep the layouts already in OUT/scale.json (default: off)")
    p.add_argument("--repeat", type=int, default=1, metavar="N",
                   help="rounds of every layout and the one-process run, interleaved; ratios take each one's median "
                   "and the JSON says how far its rounds spread (default: 1; with --resume, more rounds add to a JSON)")
    p.add_argument("--layout-limit", type=float, metavar="SECONDS",
                   help="end a layout after this long and keep what it did, marked incomplete (default: none)")


def register(sub) -> argparse.ArgumentParser:
    """Add `bench` and its one subcommand per benchmark to the `swarm` subparsers `sub`."""
    from swarm.bench import run_bench
    be = sub.add_parser("bench", help="benchmarks: JSON + PNG, ratios measured side by side",
                        description="Benchmarks. Each writes JSON (with the devices and machine it ran on) and a "
                        "PNG into --out and measures the ratios it reports side by side in one run. "
                        "`swarm bench BENCH --help` lists a benchmark's flags.")
    benches = be.add_subparsers(dest="which", required=True, metavar="BENCH")
    for add in (_add_codecs, _add_throughput, _add_convergence, _add_mfu, _add_replicas, _add_replica_sync,
                _add_verify, _add_share_tolerance, _add_fidelity, _add_churn, _add_memory, _add_record, add_simulate,
                _add_transport, _add_scale):
        add(benches)
    be.set_defaults(func=run_bench)
    return be
