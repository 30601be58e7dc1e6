"""What `swarm local` can be told besides the run spec (`LocalOptions`: each field with help is also its
flag, `swarm/local_command.py`), and the --devices list it spreads the peers over."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from protocol.spec import RunSpec
from swarm.options import opt


@dataclass
class LocalOptions:
    """What `swarm local` can be told besides the run spec; each field with help is also its flag."""

    spec: RunSpec
    steps: int = opt(200, "optimizer steps to train")
    replicas: int = opt(1, "peers per stage (they keep each other in step; any one of them may die)")
    bandwidth: str | None = opt(None, "emulated home connection of every peer: an uplink and a downlink of this "
                                "rate, each shared by all its traffic, e.g. 80mbit (default: unlimited)")
    latency: str = opt("0", "emulated one-way latency of every frame, e.g. 20ms (default: 0)")
    data: str | None = opt(None, "a text file or folder to train on (default: embedded corpus)", metavar="PATH")
    data_binary_ok: bool = opt(False, "train on --data even where its files are not text (not UTF-8); without it "
                               "such files are refused with their names")
    tokens: str | None = opt(None, "a folder made by `swarm data prepare` to train on instead of --data: recorded in "
                             "the run spec (path, manifest and tokenizer sha256; the spec's vocab becomes the "
                             "tokenizer's) and read by the heads", metavar="DIR")
    device: str = opt("cpu", "torch device for every peer, e.g. cuda")
    devices: str | None = opt(None, "comma-separated torch devices, one per peer in turn (stage i gets the i-th, "
                              "round robin), e.g. cuda:0,cuda:1 (default: --device for every peer)")
    metrics_out: str | None = opt(None, "write per-step loss, wire bytes and tokens/s", metavar="FILE.json")
    trace_frames: str | None = opt(None, "each peer writes a timeline of its frames to DIR/NAME.frames.jsonl "
                                   "(`swarm peer --trace-frames`), to see where a step's time goes", metavar="DIR")
    workdir: str | None = opt(None, "keep logs and reports here (default: a temporary folder)", metavar="DIR")
    threads: int | None = opt(None, "torch threads per peer (default: cores / processes)")
    compile: bool = opt(False, "every peer compiles its stage's blocks (`swarm coordinator --compile`: 1.36x on a "
                        "GPU, measured, after seconds of compiling)")
    quiet: bool = opt(False, "no progress bar")
    coordinator_key: str | None = None  # the swarm's signing key file (default: a fresh key in the run's folder)
    extra_peer_args: list[str] = field(default_factory=list)
    dashboard: bool = False  # `swarm local` turns it on (unless --no-dashboard); tests leave it off
    dashboard_port: int = opt(8080, "dashboard port (a free one if it is taken)")
    tensorboard: str | None = opt(None, "write the head's per-step scalars here for TensorBoard", metavar="DIR")
    checkpoint_dir: str | None = opt(None, "every peer saves its stage here when the run ends (for swarm export)",
                                     metavar="DIR")
    id_work_bits: int = opt(0, "the proof of work each peer id must carry (see `swarm coordinator --help`); 0 here, "
                            "unlike a coordinator's default, since every peer of this swarm is on this machine",
                            metavar="N")
    record_ttl: float | None = opt(None, "a shorter life of the coordinator's records in the DHT (`swarm coordinator "
                                   "--record-ttl`): to watch the swarm outlive them without a coordinator", metavar="S")


def parse_devices(text: str | None) -> list[str]:
    """"cuda:0,cuda:1" -> ["cuda:0", "cuda:1"]; None or "" -> [] (then --device serves every peer)."""
    if not text:
        return []
    devices = [d.strip() for d in text.split(",")]
    for d in devices:
        try:
            torch.device(d)
        except (RuntimeError, ValueError):
            raise ValueError(f"--devices has {d!r}, which is not a torch device; write e.g. cuda:0,cuda:1.") from None
    return devices
