"""The `swarm` command line: one console script, one subcommand per thing people do.

    swarm local        a whole swarm on this machine (the quick start)
    swarm coordinator  start a swarm: bootstrap node, run spec, signing key
    swarm peer         host one pipeline stage of a swarm
    swarm dashboard    a swarm's health in the browser, as JSON and for Prometheus
    swarm status       a table of a swarm's stages and peers
    swarm identity     make or read a libp2p identity file, print its peer id
    swarm admit        sign a ticket that admits one peer to a private swarm
    swarm unban        lift peers' bans for the run (the swarm key's holder)
    swarm bench        benchmarks that write JSON and a PNG
    swarm export       a trained model as our model.safetensors or a Hugging Face folder
    swarm eval         an exported model's held-out loss and perplexity
    swarm generate     text from an exported model
    swarm tokenizer    train a byte-level BPE tokenizer on a corpus
    swarm data         tokenize a corpus into shards a run can train on
    swarm memory       each stage's estimated peak memory and the card class it needs
"""
from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import signal
import sys
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

warnings.filterwarnings("ignore", message=".*torch.jit.script.*")  # hivemind's import warns about its own use

from swarm.local_command import cmd_local  # noqa: E402
from swarm.options import add_options, from_args  # noqa: E402
from swarm.spec_flags import add_spec_flags, spec_from_args  # noqa: E402
from swarm.user_errors import debug_wanted, explained  # noqa: E402

if TYPE_CHECKING:  # types only: each subcommand imports its modules when it runs
    from peer.replica.stage_peer import StagePeer
    from swarm.basis import BasisRefitter

log = logging.getLogger("swarm")


def enable_stack_dumps() -> None:
    """`kill -USR1 PID` writes every thread's stack to stderr (a peer's log): what a process that seems
    stuck is doing (`swarm local` asks each of its processes for this when no step finishes in time)."""
    try:
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__ or sys.stderr, all_threads=True)
    except (AttributeError, OSError, ValueError):  # no file descriptor behind stderr: nowhere to write them
        log.debug("stack dumps on SIGUSR1 are off: stderr has no file descriptor")


def setup_logging(verbose: bool) -> None:
    """The log format of every swarm process (a program that embeds a peer logs as `swarm peer` does)."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("hivemind", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING if not verbose else logging.INFO)


async def _cancel_with_parent(task: asyncio.Task) -> None:
    """Started by `swarm local`: when the launcher dies (even by SIGKILL), stop as on SIGTERM."""
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(0.5)  # poll: a child learns of its parent's death only by being re-parented
    log.warning("the process that started this one is gone; stopping")
    task.cancel()


def _run_async(coro_factory) -> int:
    """Run a coroutine with uvloop if present; SIGTERM and SIGINT cancel it so `finally` blocks clean up."""
    async def main() -> int:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        if os.environ.get("SWARM_EXIT_WITH_PARENT"):
            watch = asyncio.create_task(_cancel_with_parent(task))
            task.add_done_callback(lambda _: watch.cancel())
        try:
            return await coro_factory()
        except asyncio.CancelledError:
            log.info("stopped")
            return 0

    from swarm.reaper import start_watcher
    start_watcher()  # should this process be killed outright, its DHT process and p2pd go too
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


# ------------------------------------------------------------------ subcommands

def cmd_coordinator(a: argparse.Namespace, on_refitter: Callable[[BasisRefitter], None] | None = None) -> int:
    """`swarm coordinator`; `on_refitter`: an extension point, see `run_coordinator`."""
    from swarm.coordinator import CoordinatorOptions, run_coordinator
    from swarm.corpus_text import check_text
    from swarm.preflight import check_writable_dir
    from swarm.spec_flags import dtype_origin
    opts = from_args(CoordinatorOptions, a, spec=spec_from_args(a))
    opts.check()  # a usage error (exit 2) before anything starts
    if opts.snapshot_every < 0:
        raise ValueError("--snapshot-every must be 0 (no snapshots) or a positive number of steps.")
    check_text(opts.data, opts.data_binary_ok)
    if opts.checkpoint_dir:
        check_writable_dir(opts.checkpoint_dir, "--checkpoint-dir")
    spec = opts.spec
    print(f"swarm coordinator: {spec.name}, {spec.n_stages} stages, codec {spec.codec}, dtype {spec.dtype} "
          f"({dtype_origin(a)})", file=sys.stderr, flush=True)
    return _run_async(lambda: run_coordinator(opts, on_refitter))


def cmd_peer(a: argparse.Namespace, on_stage_peer: Callable[[StagePeer], None] | None = None) -> int:
    """`swarm peer`; `on_stage_peer`: an extension point, see `run_peer`."""
    from peer.runner.memory_estimate import parse_size
    from swarm.corpus_text import check_text
    from swarm.net.addresses import announce_addresses
    from swarm.node import PeerOptions, configure_torch, run_peer
    from swarm.preflight import check_device, check_port, check_writable_dir
    opts = from_args(PeerOptions, a)
    announce_addresses(opts.host_maddrs, opts.public_ip, opts.announce_maddrs)  # the flags first (exit 2)...
    check_device(opts.device)  # ...then what this machine can do (exit 1)
    for port, flag in ((opts.health_port, "--health-port"), (opts.direct_port, "--direct-port")):
        check_port(port, flag)
    check_text(opts.data, opts.data_binary_ok)
    if opts.max_memory:
        parse_size(opts.max_memory)  # a usage error (exit 2), before anything starts
    if opts.checkpoint_dir:
        check_writable_dir(opts.checkpoint_dir, "--checkpoint-dir")
    configure_torch(opts.threads or int(os.environ.get("SWARM_TORCH_THREADS", "0")) or None)
    # a JoinError, LinkError, StateError, ReachabilityError or PeerBanned is one sentence, exit 1 (`main`'s `explained`)
    return _run_async(lambda: run_peer(opts, on_stage_peer))


def cmd_dashboard(a: argparse.Namespace) -> int:
    from swarm.dashboard.server import DashboardOptions, run_dashboard
    from swarm.monitor.reader_ticket import ReaderTicket
    from swarm.preflight import check_port
    opts = from_args(DashboardOptions, a)
    check_port(opts.port, "--port")
    reader = ReaderTicket.read(opts.identity, opts.ticket)  # a bad pair: one sentence, exit 2, before any daemon starts
    return _run_async(lambda: run_dashboard(opts, reader))  # a taken port: one sentence, exit 1 (`main`'s `explained`)


def cmd_status(a: argparse.Namespace) -> int:
    from swarm.monitor.reader_ticket import ReaderTicket
    from swarm.monitor.status import print_status
    reader = ReaderTicket.read(a.identity, a.ticket)  # a bad pair: one sentence, exit 2, before any daemon starts
    return _run_async(lambda: print_status(a.initial_peers, as_json=a.json, reader=reader))


def cmd_trace(a: argparse.Namespace) -> int:
    from swarm.net.trace_report import run_trace_report
    return run_trace_report(a.paths, a.json)


def cmd_identity(a: argparse.Namespace) -> int:
    from swarm.trust.identity import Identity
    from swarm.trust.state_dir import default_file
    path = a.path or default_file("peer.id", a.state_dir)
    existed = os.path.exists(path)
    identity = Identity.load_or_create(path)
    print(identity.peer_id)
    if not existed:
        print(f"wrote a new Ed25519 identity to {path} (keep it private; start the peer with --identity "
              f"{os.path.abspath(path)})", file=sys.stderr)
    return 0


def cmd_admit(a: argparse.Namespace) -> int:
    import time

    from swarm.trust.admission import AdmitOptions, issue_ticket
    from swarm.trust.keys import fingerprint_of
    ticket = issue_ticket(from_args(AdmitOptions, a))
    print(ticket.encode())
    until = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ticket.expires)) if ticket.expires else "never"
    print(f"admits peer {ticket.peer_id} to the swarm of key {fingerprint_of(ticket.swarm_key)}; expires: "
          f"{until}. The peer starts with `swarm peer --identity ITS_FILE --ticket TICKET ...`.", file=sys.stderr)
    return 0


def cmd_unban(a: argparse.Namespace) -> int:
    from swarm.unban_command import UnbanOptions, unban
    return _run_async(lambda: unban(from_args(UnbanOptions, a)))


def cmd_export(a: argparse.Namespace) -> int:
    from swarm.export.exporter import ExportOptions, run_export
    files = run_export(from_args(ExportOptions, a))  # a missing extra: one sentence, exit 1
    print(f"exported to {a.out}: {', '.join(f.name for f in files)}")
    return 0


def cmd_eval(a: argparse.Namespace) -> int:
    from dataclasses import asdict

    from swarm.export.evaluate import EvalOptions, describe, run_eval
    result = run_eval(from_args(EvalOptions, a))  # a missing extra: one sentence, exit 1
    print(json.dumps(asdict(result)) if a.json else f"eval: {describe(result)}")
    return 0


def cmd_generate(a: argparse.Namespace) -> int:
    from swarm.export.generate import GenerateOptions, run_generate
    text, note = run_generate(from_args(GenerateOptions, a))  # a missing extra: one sentence, exit 1
    print(text)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------ parser

def build_parser() -> argparse.ArgumentParser:
    from swarm.bench.cli import register as register_bench
    from swarm.coordinator import CoordinatorOptions
    from swarm.dashboard.server import DashboardOptions
    from swarm.data.cli import register as register_data
    from swarm.export.evaluate import EvalOptions
    from swarm.export.exporter import ExportOptions
    from swarm.export.generate import GenerateOptions
    from swarm.local import LocalOptions
    from swarm.memory_command import register as register_memory
    from swarm.node import PeerOptions
    from swarm.trust.admission import AdmitOptions
    from swarm.trust.state_dir import WHERE
    p = argparse.ArgumentParser(prog="swarm", description="Train one transformer across many peers over the "
                                "internet, with compressed pipeline boundaries (subspace ~100x, bottleneck ~128x).")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.add_argument("--debug", action="store_true", help="on an error, the traceback instead of one sentence (anywhere "
                   "on the command line; SWARM_DEBUG=1 does the same)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    lo = sub.add_parser("local", help="run a whole swarm on this machine (coordinator + one peer per stage)",
                        description="Run a coordinator and one peer per stage as separate processes on loopback, "
                        "train on the embedded corpus (or --data, or a --tokens folder), show progress, and stop "
                        "everything at the end.")
    add_spec_flags(lo)
    add_options(lo, LocalOptions)
    lo.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    lo.set_defaults(func=cmd_local)

    co = sub.add_parser("coordinator", help="start a swarm: bootstrap DHT node, signed run spec",
                        description="Start a swarm's bootstrap node, sign its run spec with the swarm key and keep "
                        "it published. Prints the address that peers pass to --initial-peers.")
    add_spec_flags(co)
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
    st.add_argument("--identity", metavar="FILE", help="private swarms with no coordinator up: the identity file "
                    "--ticket was issued to (give the tool its own: `swarm identity monitor.id`, then `swarm admit`)")
    st.add_argument("--ticket", metavar="TICKET", help="private swarms with no coordinator up: a ticket from `swarm "
                    "admit` (or a file holding it), with which the peers re-serve the run spec")
    st.set_defaults(func=cmd_status)

    tr = sub.add_parser("trace", help="where each peer's frame time went, from its --trace-frames file",
                        description="Read frame traces (swarm peer --trace-frames FILE, swarm local --trace-frames "
                        "DIR) and print, per peer, how busy its uplink was and, per kind of request, how long "
                        "requests queued for the uplink, were on the wire and waited for their reply, and how long "
                        "the downlink held what arrived.")
    tr.add_argument("paths", nargs="+", metavar="FILE|DIR", help="trace files, or folders of NAME.frames.jsonl")
    tr.add_argument("--json", metavar="FILE", help="also write the figures here as JSON")
    tr.set_defaults(func=cmd_trace)

    idn = sub.add_parser("identity", help="make or read a libp2p identity file and print its peer id",
                         description="Print the peer id of the libp2p identity in FILE, creating a new Ed25519 one "
                         "there if there is none. A peer started with --identity FILE keeps that id; a private "
                         "swarm's coordinator admits it by that id (swarm admit).")
    idn.add_argument("path", metavar="FILE", nargs="?",
                     help="identity file, created (mode 0600) if missing, used as given (default: peer.id in the "
                     "state folder)")
    idn.add_argument("--state-dir", metavar="DIR",
                     help=f"the state folder, where the default FILE lives (default: {WHERE}; created mode 0700)")
    idn.set_defaults(func=cmd_identity)

    ad = sub.add_parser("admit", help="sign a ticket admitting one peer to a private swarm",
                        description="Print a ticket, signed by the swarm key, that admits the peer with this id to a "
                        "swarm started with `swarm coordinator --private --key FILE`. No server is involved.")
    add_options(ad, AdmitOptions)
    ad.set_defaults(func=cmd_admit)

    from swarm.unban_command import UnbanOptions
    un = sub.add_parser("unban", help="lift peers' bans for the run (the swarm key's holder)",
                        description="Lift the ban of each PEER for the run: the leading head banned it (it convicted "
                        "its work: false, withheld or too slow; `swarm status` lists bans with the reason). Signed "
                        "with the swarm key and stored in the DHT, every peer reads it within seconds; then start the "
                        "peer again with the same --identity. A later conviction bans it again.")
    un.add_argument("peers", nargs="+", metavar="PEER", help="the banned peer's id, as `swarm status` lists it")
    add_options(un, UnbanOptions)
    un.set_defaults(func=cmd_unban)

    register_bench(sub)
    register_data(sub)
    register_memory(sub)

    ex = sub.add_parser("export", help="a trained model as our model.safetensors or a Hugging Face folder",
                        description="Gather every stage's state (one replica per stage, all at the same step, "
                        "hashes checked) from checkpoint folders or a running swarm, and write model.safetensors "
                        "with the run spec, basis version and tokenizer, or (--format hf) a LlamaForCausalLM "
                        "folder that transformers loads without custom code (dense and subspace runs). Writing "
                        "either needs only `pip install -e .`; loading the hf folder in transformers (or with "
                        "swarm eval / generate) needs `pip install -e '.[export]'`.")
    add_options(ex, ExportOptions)
    ex.set_defaults(func=cmd_export)

    ev = sub.add_parser("eval", help="an exported model's held-out loss and perplexity",
                        description="Loss (nats per token) and perplexity of an exported model on the validation "
                        "split of the corpus it trained on (recorded in the run spec by `swarm coordinator --data` "
                        "or `swarm local --data`, or the folder of their --tokens; the embedded corpus if none), or of "
                        "--data or --tokens, or on a training step's microbatches. The output names the corpus it "
                        "scored.")
    add_options(ev, EvalOptions)
    ev.set_defaults(func=cmd_eval)

    ge = sub.add_parser("generate", help="text from an exported model",
                        description="Continue --prompt by sampling bytes from an exported model "
                        "(temperature, top-k), on the CPU or a GPU. The model sees at most its context (the "
                        "run's seq_len) of the last bytes: a longer text slides that window, and the command "
                        "says so on stderr.")
    add_options(ge, GenerateOptions)
    ge.set_defaults(func=cmd_generate)
    return p


def main(argv: list[str] | None = None) -> int:
    """Every failure a user can meet is one sentence and exit code 2 or 1 (`swarm/user_errors.py`);
    `--debug` anywhere on the line, or SWARM_DEBUG=1, shows the traceback instead."""
    debug, argv = debug_wanted(sys.argv[1:] if argv is None else list(argv))
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    enable_stack_dumps()
    return explained(lambda: args.func(args), debug)


if __name__ == "__main__":
    sys.exit(main())
