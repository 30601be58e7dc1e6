"""The `swarm` command line: one console script, one subcommand per thing people do.

    swarm local        a whole swarm on this machine (the quick start)
    swarm coordinator  start a swarm: bootstrap node, run spec, signing key
    swarm peer         host one pipeline stage of a swarm
    swarm dashboard    a swarm's health in the browser, as JSON and for Prometheus
    swarm status       a table of a swarm's stages and peers
    swarm bench        benchmarks that write JSON and a PNG
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import warnings

warnings.filterwarnings("ignore", message=".*torch.jit.script.*")  # hivemind's import warns about its own use

from protocol.spec import COMPUTE_DTYPES, PRESETS, RunSpec, SpecError, preset  # noqa: E402
from swarm.options import add_options, from_args  # noqa: E402

log = logging.getLogger("swarm")


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("hivemind", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING if not verbose else logging.INFO)


def _run_async(coro_factory) -> int:
    """Run a coroutine with uvloop if present; SIGTERM and SIGINT cancel it so `finally` blocks clean up."""
    async def main() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await coro_factory()
        except asyncio.CancelledError:
            log.info("stopped")
            return 0

    try:
        import uvloop
        code = uvloop.run(main())
    except ImportError:
        code = asyncio.run(main())
    # Every daemon is stopped by now (the coroutine's `finally` blocks). If a Ctrl+C also hit the
    # DHT's child process, the interpreter's exit hooks can wait on it forever: skip them.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# ------------------------------------------------------------------ spec from flags

def _add_spec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("run spec (ignored with --run-spec)")
    g.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model size (default: tiny)")
    g.add_argument("--run-spec", metavar="FILE", help="a run spec as JSON or TOML instead of a preset")
    g.add_argument("--stages", type=int, help="number of pipeline stages (default: the preset's)")
    g.add_argument("--codec", choices=["dense", "subspace", "bottleneck"],
                   help="boundary compression (default: subspace)")
    g.add_argument("--rank", type=int, help="subspace rank k or bottleneck width b")
    g.add_argument("--wire-dtype", choices=["fp32", "bf16"], help="dtype of numbers on the wire")
    g.add_argument("--quant", choices=["none", "int8"], help="int8 quantization under the codec")
    g.add_argument("--dtype", choices=sorted(COMPUTE_DTYPES),
                   help="compute dtype: bf16 (autocast, fp32 master weights), fp32 or fp64 (default: fp32)")
    g.add_argument("--basis-interval", type=int, help="steps between basis re-fits (default: 500)")
    g.add_argument("--seed", type=int, help="seed of weights and shared constants")


def _spec_from_args(a: argparse.Namespace) -> RunSpec:
    if a.run_spec:
        return RunSpec.load(a.run_spec)
    return preset(a.preset, stages=a.stages, codec=a.codec, rank=a.rank, wire_dtype=a.wire_dtype, quant=a.quant,
                  basis_interval=a.basis_interval, seed=a.seed, dtype=a.dtype)


# ------------------------------------------------------------------ subcommands

def cmd_local(a: argparse.Namespace) -> int:
    from peer.data import load_corpus

    from .local import LocalOptions, LocalSwarmError, parse_devices, run_local
    from .net import parse_bandwidth, parse_latency
    spec = _spec_from_args(a)
    # bad values fail here, before any process starts
    parse_bandwidth(a.bandwidth), parse_latency(a.latency), parse_devices(a.devices)
    load_corpus(a.data, seq_len=spec.seq_len)
    print(f"swarm local: {spec.name} preset, {spec.n_stages} stages, codec {spec.codec}"
          f"{'' if spec.codec == 'dense' else f' (rank {spec.rank})'}, {a.steps} steps, wire {spec.wire_dtype}"
          f"{', link ' + a.bandwidth if a.bandwidth else ''}{', latency ' + a.latency if a.latency != '0' else ''}")
    try:
        result = run_local(from_args(LocalOptions, a, spec=spec, dashboard=not a.no_dashboard))
    except KeyboardInterrupt:
        print("interrupted; every process this run started has been stopped.", file=sys.stderr)
        return 130
    except LocalSwarmError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    steps, wire = result["steps"], result["wire"]
    print(f"done: {len(steps)} steps, loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, "
          f"{result['tokens_per_second']:.0f} tokens/s, wire {wire['forward_bytes_per_token']:.1f} B/token forward "
          f"(dense would be {wire['dense_forward_bytes_per_token']:.1f}: "
          f"{wire['dense_forward_bytes_per_token'] / max(wire['forward_bytes_per_token'], 1e-9):.1f}x smaller)")
    if a.metrics_out:
        print(f"metrics written to {a.metrics_out}")
    return 0


def cmd_coordinator(a: argparse.Namespace) -> int:
    from .coordinator import CoordinatorOptions, run_coordinator
    opts = from_args(CoordinatorOptions, a, spec=_spec_from_args(a))
    return _run_async(lambda: run_coordinator(opts))


def cmd_peer(a: argparse.Namespace) -> int:
    from .node import PeerOptions, configure_torch, run_peer
    opts = from_args(PeerOptions, a)
    configure_torch(opts.threads or int(os.environ.get("SWARM_TORCH_THREADS", "0")) or None)
    from peer.daemon import StepFailed
    from peer.interfaces import LinkError

    from .node import JoinError
    try:
        return _run_async(lambda: run_peer(opts))
    except (JoinError, LinkError, StepFailed) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def cmd_dashboard(a: argparse.Namespace) -> int:
    from .dashboard.server import DashboardOptions, run_dashboard
    opts = from_args(DashboardOptions, a)
    try:
        return _run_async(lambda: run_dashboard(opts))
    except RuntimeError as e:  # e.g. the port is taken: one sentence, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


def cmd_status(a: argparse.Namespace) -> int:
    from .monitor.status import print_status
    return _run_async(lambda: print_status(a.initial_peers, as_json=a.json))


def cmd_bench(a: argparse.Namespace) -> int:
    from .bench import run_bench
    return run_bench(a)


# ------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    from .coordinator import CoordinatorOptions
    from .dashboard.server import DashboardOptions
    from .local import LocalOptions
    from .node import PeerOptions
    p = argparse.ArgumentParser(prog="swarm", description="Train one transformer across many peers over the "
                                "internet, with compressed pipeline boundaries (subspace ~100x, bottleneck ~128x).")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    lo = sub.add_parser("local", help="run a whole swarm on this machine (coordinator + one peer per stage)",
                        description="Run a coordinator and one peer per stage as separate processes on loopback, "
                        "train on the embedded corpus (or --data), show progress, and stop everything at the end.")
    _add_spec_flags(lo)
    add_options(lo, LocalOptions)
    lo.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    lo.set_defaults(func=cmd_local)

    co = sub.add_parser("coordinator", help="start a swarm: bootstrap DHT node, signed run spec",
                        description="Start a swarm's bootstrap node, sign its run spec with the swarm key and keep "
                        "it published. Prints the address that peers pass to --initial-peers.")
    _add_spec_flags(co)
    add_options(co, CoordinatorOptions)
    co.set_defaults(func=cmd_coordinator)

    pe = sub.add_parser("peer", help="host one pipeline stage of a swarm",
                        description="Join a swarm, host one pipeline stage and serve it until stopped. A stage-0 "
                        "peer (head) reads the data and drives the training steps.")
    add_options(pe, PeerOptions)
    pe.set_defaults(func=cmd_peer)

    da = sub.add_parser("dashboard", help="a swarm's health in the browser (and /api/v1/state, /metrics)",
                        description="Join a swarm's DHT as a client and serve a live page of its stages, peers, "
                        "loss, throughput and wire bytes, a JSON API (/api/v1/state) and Prometheus metrics "
                        "(/metrics).")
    add_options(da, DashboardOptions)
    da.set_defaults(func=cmd_dashboard)

    st = sub.add_parser("status", help="a table of a swarm's stages and peers")
    st.add_argument("--initial-peers", nargs="+", required=True, metavar="MADDR")
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    st.set_defaults(func=cmd_status)

    be = sub.add_parser("bench", help="benchmarks: JSON + PNG, ratios measured side by side")
    be.add_argument("which", choices=["codecs", "throughput", "convergence", "mfu"],
                    help="codecs: bytes/token and encode/decode time; throughput: tokens/s of local swarms per "
                    "codec, unlimited vs 80mbit; convergence: loss vs tokens, fixed U vs re-fitted U vs dense; "
                    "mfu: the device's bf16 matmul rate and the share of it whole-model training uses")
    be.add_argument("--out", default="bench-out", help="output folder (default: bench-out)")
    be.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
    be.add_argument("--preset", choices=sorted(PRESETS),
                    help="model size (default: small; large for mfu)")
    be.add_argument("--steps", type=int,
                    help="steps per run (default: 20 for throughput, 2000 for convergence, 10 timed for mfu)")
    be.add_argument("--stages", type=int, help="throughput: pipeline stages (default: the preset's)")
    be.add_argument("--codec", choices=["dense", "subspace", "bottleneck"], help="mfu: codec (default: dense)")
    be.add_argument("--dtype", choices=sorted(COMPUTE_DTYPES),
                    help="compute dtype (default: bf16 for mfu, the preset's otherwise)")
    be.add_argument("--microbatch-size", type=int, help="mfu: sequences per microbatch (default: the preset's)")
    be.add_argument("--matmul-size", type=int, default=8192, help="mfu: n of the n^3 bf16 matmul (default: 8192)")
    be.add_argument("--compile", action="store_true", help="mfu: torch.compile every block")
    be.add_argument("--throughput-json", metavar="FILE",
                    help="convergence: throughput results for the time-to-loss plot (default: OUT/throughput.json)")
    be.add_argument("--link", help="convergence: the limited link of the time-to-loss plot, e.g. 80mbit "
                    "(default: the throughput results' first)")
    be.add_argument("--curves-json", metavar="FILE",
                    help="convergence: take the loss curves from this convergence.json instead of training")
    be.add_argument("--data", default="stdlib", help="convergence: corpus (default: the Python standard library)")
    be.add_argument("--bandwidth", default="80mbit",
                    help="throughput: the limited links, comma-separated, e.g. 8mbit,80mbit (default: 80mbit)")
    be.add_argument("--latency", default="0", help="throughput: one-way latency on the limited links")
    be.add_argument("--device", default="cpu", help="torch device (throughput: of every peer)")
    be.add_argument("--devices", help="throughput: comma-separated devices, one per peer in turn (e.g. cuda:0,cuda:1)")
    be.add_argument("--kernel-shaping", action="store_true",
                    help="throughput: also run each limited link with every process in its own network namespace "
                    "and tc tbf on its uplink and downlink (needs root; skipped with a message where not allowed)")
    be.set_defaults(func=cmd_bench)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.verbose)
    try:
        return args.func(args)
    except (SpecError, ValueError) as e:  # bad input a user can fix: DataError, a bad --bandwidth, ...
        if args.verbose:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
