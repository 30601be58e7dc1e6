"""The flags of the hardware room's benches (`swarm bench codecs|mfu|memory|transport|scale`). Apart from
hardware/cli.py, which runs them, because `python -m swarm.bench.hardware.memory` reads memory's flags too and
cli.py imports memory.py: one file would be an import circle."""
from __future__ import annotations

import argparse

from protocol.spec import CODECS
from swarm.bench.common.flags import add_common, add_dtype, add_preset, sizes_list


def add_codecs(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("codecs", help="bytes/token and encode/decode time per codec",
                       description="Bytes per token on the wire and encode/decode time of each codec (dense, "
                       "subspace, bottleneck) at d = 512, 1024, 4096, on the CPU; writes codecs.json and a PNG.")
    add_common(p, device=False)
    return p


def add_mfu(sub) -> argparse.ArgumentParser:
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
    return p


def add_memory(sub) -> argparse.ArgumentParser:
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
    p.add_argument("--vocab", type=int, metavar="N", help="measure every preset at vocabulary N, e.g. 32768 (a BPE's); "
                   "the subspace's T_fixed [N, d] is built from the seed on every stage and never sent, and the "
                   "bench prints its memory at 256 and 32k-128k first (default: each preset's own)")
    return p


def add_transport(sub) -> argparse.ArgumentParser:
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
    return p


def add_scale(sub) -> argparse.ArgumentParser:
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
    return p
