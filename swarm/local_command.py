"""`swarm local`'s command: every check before anything starts, the banner, the run and its last line.

What the user gave is checked first (steps, ports, devices, the corpus, a checkpoint folder that
can be written, the memory the stages need on each device), so that a mistake is one sentence
and starts no process. The banner names the compute dtype and where it came from. The last line
says "done" only when the run did what was asked: with `--checkpoint-dir`, every stage's
checkpoint is on disk. The run itself is `swarm/local.py`'s.
"""
from __future__ import annotations

import argparse
import signal
import sys

from swarm.options import from_args
from swarm.user_errors import Refused


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def check_local_flags(a: argparse.Namespace) -> list[str]:
    """ValueError/Refused for a flag of `swarm local` that cannot work here; returns the peers' devices."""
    from peer.data.run_tokens import check_data_flags
    from swarm.local import parse_devices
    from swarm.net import parse_bandwidth, parse_latency
    from swarm.preflight import check_device, check_port, check_positive, check_writable_dir, check_writable_file
    check_positive(a.steps, "--steps", "the optimizer steps to train")
    check_positive(a.replicas, "--replicas", "peers per stage")
    if a.threads is not None:
        check_positive(a.threads, "--threads", "torch threads per peer")
    check_port(a.dashboard_port, "--dashboard-port")
    parse_bandwidth(a.bandwidth), parse_latency(a.latency)
    devices = parse_devices(a.devices) or [a.device]
    for d in devices:
        check_device(d, "--devices" if a.devices else "--device")
    check_data_flags(a.data, a.tokens)
    for folder, flag in ((a.checkpoint_dir, "--checkpoint-dir"), (a.workdir, "--workdir"),
                         (a.trace_frames, "--trace-frames"), (a.tensorboard, "--tensorboard")):
        if folder:
            check_writable_dir(folder, flag)
    if a.metrics_out:
        check_writable_file(a.metrics_out, "--metrics-out")
    return devices


def cmd_local(a: argparse.Namespace) -> int:
    from peer.data.corpus import load_corpus
    from peer.data.run_tokens import with_tokens
    from swarm.corpus_text import check_text
    from swarm.local import LocalOptions, LocalSwarmError, run_local
    from swarm.memory_command import check_local_memory
    from swarm.spec_flags import dtype_origin, spec_from_args, spec_notes
    spec = spec_from_args(a)
    devices = check_local_flags(a)  # bad values fail here, before any process starts
    spec = with_tokens(spec, a.tokens)  # a bad folder fails here; the peers build the tokenizer's vocab
    check_text(a.data, a.data_binary_ok)
    load_corpus(a.data, seq_len=spec.seq_len)
    check_local_memory(spec, devices, a.replicas)
    print(f"swarm local: {spec.name} preset, {spec.n_stages} stages"
          f"{f' x {a.replicas} replicas ({spec.replica_sync} sync)' if a.replicas > 1 else ''}, codec {spec.codec}"
          f"{'' if spec.codec == 'dense' else f' (rank {spec.rank})'}, {a.steps} steps, dtype {spec.dtype} "
          f"({dtype_origin(a)}), wire {spec.wire_dtype}"
          f"{', link ' + a.bandwidth if a.bandwidth else ''}{', latency ' + a.latency if a.latency != '0' else ''}"
          f"{spec_notes(spec)}")
    # SIGTERM must stop the swarm too, and so must a SIGINT sent to a job started with & from a script
    # (it inherits SIGINT ignored, which Python keeps): run the same cleanup as Ctrl+C
    signal.signal(signal.SIGTERM, _raise_interrupt)
    signal.signal(signal.SIGINT, _raise_interrupt)
    try:
        result = run_local(from_args(LocalOptions, a, spec=spec, dashboard=not a.no_dashboard))
    except KeyboardInterrupt:
        print("interrupted; every process this run started has been stopped.", file=sys.stderr)
        return 130
    except LocalSwarmError as e:  # its first line is the sentence; what follows, the tail of the log it names
        sentence, _, tail = str(e).partition("\n")
        if tail.strip():  # the tail first, so that the sentence is the last line, as every error's is
            print(tail.rstrip(), file=sys.stderr)
            sentence = sentence.rstrip().removesuffix(" ends with:") + " ends with the lines above."
        print(f"error: {sentence}", file=sys.stderr)
        return 1
    steps, wire = result["steps"], result["wire"]
    if not steps:  # a head that said done without a step: nothing to report as done
        raise Refused("the swarm stopped before its first step; see the logs (pass --workdir DIR to keep them).")
    missing = result.get("missing_checkpoints") or []
    if missing:
        raise Refused(f"the run trained {len(steps)} steps but stage{'s' if len(missing) > 1 else ''} "
                      f"{', '.join(map(str, missing))} wrote no checkpoint to {a.checkpoint_dir}; the peers' logs "
                      f"say why (pass --workdir DIR to keep them).")
    line = (f"done: {len(steps)} steps, loss {steps[0]['loss']:.3f} -> {steps[-1]['loss']:.3f}, "
            f"{result['tokens_per_second']:.0f} tokens/s")
    if wire['forward_bytes_per_token'] > 0:  # a one-stage swarm sends no activations
        line += (f", wire {wire['forward_bytes_per_token']:.1f} B/token forward (dense would be "
                 f"{wire['dense_forward_bytes_per_token']:.1f}: "
                 f"{wire['dense_forward_bytes_per_token'] / wire['forward_bytes_per_token']:.1f}x smaller)")
    print(line)
    if a.checkpoint_dir:
        print(f"checkpoints of every stage written to {a.checkpoint_dir}")
    if a.metrics_out:
        print(f"metrics written to {a.metrics_out}")
    return 0
