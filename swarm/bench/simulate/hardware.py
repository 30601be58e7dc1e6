"""What the simulator's peers are made of: GPUs and home links, and the work and bytes of a step
taken from the run spec and the project's own encoders.

GPUs. `GPUS` holds each card's dense bf16 tensor rate (fp32 accumulate) from NVIDIA's own
figures: the Ampere GA102 and Ada AD102 architecture whitepapers (GeForce cards: "Peak
FP16/BF16 Tensor TFLOPS with FP32 Accumulate", dense, i.e. the sparse figure halved) and the
product pages of the RTX A4000/A5000 (153.4 / 222.2 sparse TFLOPS), A100 (312 dense) and H100
SXM (989 dense). Each equals SMs x boost clock x FLOPs per SM per clock (512 on GeForce cards
with fp32 accumulate, 1024 on the workstation and datacenter parts), e.g. RTX 3090:
82 x 1.695 GHz x 512 = 71.2 TFLOP/s. A peer sustains `mfu` of it (0.4 by default: the project
measured 42.6% MFU for `large` bf16 on one H100, benchmarks.md). A stage's microbatch takes

    t_fwd = B T (2 N_s + 4 L_s T d) / (R mfu),   t_bwd = 2 t_fwd                  (per microbatch)

with N_s the weights the stage multiplies per token (those `swarm/bench/hardware/mfu.py` `matmul_weights`
counts, the LM head included on the last stage), L_s its layers, T the sequence length, d the width:
6 N + 12 L T d per token for forward and backward, split 1 : 2 (`mfu.py`'s formula, stage by
stage). A calibrated table of measured seconds per stage replaces it when validating on a CPU.

Links. Each host's uplink is drawn uniformly from `uplink_mbit` (10-200 Mbit/s by default) and its
one-way latency from `latency_ms` (10-150 ms); the downlink has the uplink's rate times
`downlink_ratio` (1: symmetric, as `swarm local --bandwidth` shapes it). The link is the
project's own `HomeLink` (swarm/net/home_link.py: the uplink's frames share its rate, TCP/IP
headers and acknowledgements counted) on the virtual clock.

Bytes. A boundary message's size is a real activation or gradient message of one microbatch
encoded by protocol/wire.py with the spec's codec, wire dtype and quantisation, plus the
transport's framing; a replica's reduce is `sync_bytes.py`'s encoded contribution (exact: one
round; powersgd: two); a joining replica downloads 12 bytes per trainable parameter (fp32
weights and AdamW's two moments) in 8 MiB chunks, then is forwarded every step applied since its
snapshot (`follow`: under powersgd the reduce's sums, exact part, P and Q' in the compute dtype,
peer/commit/follow_forward.py; `follow="whole"` models the code before 2026-12-01, which forwarded the
stage's whole layout, and every parameter's gradient from a donor alone in its reduce).
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch

from protocol.codecs import WirePacker
from protocol.model import compute_dtype
from protocol.powersgd import PowerPlan
from protocol.spec import WIRE_DTYPES, RunSpec
from protocol.wire import ActivationMessage, GradientMessage, Header, encode_message, tokens_for_wire
from swarm.bench.replicas.sync_bytes import FRAMING, encoded_size, stage_layout
from swarm.net import REPLY_OVERHEAD, REQUEST_OVERHEAD, HomeLink
from swarm.net.home_link import DownlinkShaper
from swarm.net.shaper import LinkShaper

# card -> dense bf16 tensor TFLOP/s (module docstring for the sources)
GPUS: dict[str, float] = {
    "RTX 3060": 25.5, "RTX 3070": 40.6, "RTX 3080": 59.5, "RTX 3090": 71.2,
    "RTX 4070": 58.3, "RTX 4080": 97.5, "RTX 4090": 165.2,
    "RTX A4000": 76.7, "RTX A5000": 111.1,
    "A100": 312.0, "H100": 989.0,
}
CONSUMER = ("RTX 3060", "RTX 3070", "RTX 3080", "RTX 3090", "RTX 4070", "RTX 4080", "RTX 4090", "RTX A4000",
            "RTX A5000")
DATACENTER = ("A100", "H100")
STATE_BYTES_PER_PARAM = 12  # fp32 weights + AdamW's two moments


@dataclass(frozen=True)
class StageWork:
    """Per stage: seconds per microbatch forward and backward on a device of 1 FLOP/s (so divide by
    the device's sustained FLOP/s), or measured seconds when `flops_per_second` of the peer is 1."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    apply: tuple[float, ...] | None = None  # the optimizer step per stage (measured; None: not modelled)

    def seconds(self, stage: int, rate: float) -> tuple[float, float]:
        return self.forward[stage] / rate, self.backward[stage] / rate


def stage_flops(spec: RunSpec) -> StageWork:
    """FLOPs of one microbatch per stage, forward and backward (module docstring), with

        N_s = L_s (4 d^2 + 3 d d_ff) + [last stage] d V

    the weights `mfu.matmul_weights` counts on a built stage (q, k, v, o, SwiGLU's three maps,
    the LM head), written out so that no module is built."""
    fwd, bwd = [], []
    tokens = spec.microbatch_size * spec.seq_len
    d = spec.d_model
    for s, layers in enumerate(spec.stage_layers):
        n = layers * (4 * d * d + 3 * d * spec.d_ff) + (d * spec.vocab if s == spec.n_stages - 1 else 0)
        f = tokens * (2 * n + 4 * layers * spec.seq_len * d)
        fwd.append(float(f))
        bwd.append(2.0 * f)
    return StageWork(tuple(fwd), tuple(bwd))


@dataclass(frozen=True)
class Gpu:
    name: str
    flops_per_second: float  # sustained: tensor rate x mfu


def gpu(name: str, mfu: float) -> Gpu:
    if name not in GPUS:
        raise ValueError(f"unknown GPU {name!r}; choose from {', '.join(GPUS)}.")
    return Gpu(name, GPUS[name] * 1e12 * mfu)


@dataclass(frozen=True)
class LinkDraw:
    """The distribution every host's link is drawn from (module docstring)."""

    uplink_mbit: tuple[float, float] = (10.0, 200.0)
    latency_ms: tuple[float, float] = (10.0, 150.0)
    downlink_ratio: float = 1.0

    def draw(self, rng: random.Random) -> tuple[float, float]:
        """(uplink bit/s, one-way latency s)."""
        return rng.uniform(*self.uplink_mbit) * 1e6, rng.uniform(*self.latency_ms) / 1e3

    def link(self, uplink_bps: float, latency_s: float, clock) -> HomeLink:
        up = LinkShaper(uplink_bps, latency_s, clock=clock)
        return HomeLink(up, DownlinkShaper(uplink_bps * self.downlink_ratio, clock=clock))


@dataclass(frozen=True)
class WireBytes:
    """Bytes of the messages of one step, framing included (module docstring)."""

    activation: int  # one microbatch's boundary activation (+ its empty acknowledgement)
    gradient: int  # one microbatch's boundary gradient (+ acknowledgement)
    sync_rounds: tuple[tuple[int, ...], ...]  # per stage: bytes one replica sends each other replica, per round
    state: tuple[int, ...]  # per stage: bytes of a state download
    command: int = 200  # a driver command (reduce, apply) or its reply
    follow: tuple[int, ...] = ()  # per stage: bytes of one step forwarded to a replica catching up
    follow_alone: tuple[int, ...] = ()  # the same from a donor alone in its reduce


def wire_bytes(spec: RunSpec, follow: str = "sums") -> WireBytes:
    """Measured by encoding real messages of one microbatch (module docstring); `follow`: "sums" (what the
    swarm forwards to a replica catching up) or "whole" (what it forwarded before 2026-12-01)."""
    B, T = spec.microbatch_size, spec.seq_len
    packer = WirePacker.for_spec(spec)
    z = torch.zeros(B, T, spec.boundary_width)
    h = Header(spec.run_hash, 10**6, 10**3, 0, spec.codec, 1, 10)
    act = encode_message(ActivationMessage(h, tokens_for_wire(torch.zeros(B, T + 1, dtype=torch.long), spec.vocab),
                                           packer.pack(z)))
    grad = encode_message(GradientMessage(h, packer.pack(z), 1.0))
    framing = REQUEST_OVERHEAD + REPLY_OVERHEAD
    dtype, factor_dtype = compute_dtype(spec), WIRE_DTYPES[spec.wire_dtype]
    if follow not in ("sums", "whole"):
        raise ValueError(f"follow must be 'sums' or 'whole', not {follow!r}.")
    rounds, state, fol, alone = [], [], [], []
    elem = torch.tensor([], dtype=dtype).element_size()
    for s in range(spec.n_stages):
        layout, n_params = stage_layout(spec, s)
        stat = spec.codec == "subspace" and spec.basis_updates and s > 0
        mbs = list(range(max(1, spec.n_microbatches // 2)))
        stat_bytes = 8 * spec.d_model * spec.rank if stat else 0
        whole = (elem * layout.numel + stat_bytes + FRAMING, elem * n_params + stat_bytes + FRAMING)
        if spec.replica_sync == "powersgd":
            plan = PowerPlan.for_layout(layout, spec.replica_sync_rank)
            rounds.append((encoded_size(spec, s, mbs, (plan.exact_numel, dtype), (plan.p_numel, factor_dtype), stat)
                           + FRAMING,
                           encoded_size(spec, s, [], None, (plan.q_numel, factor_dtype), False, phase=1) + FRAMING))
            sums = elem * (plan.exact_numel + plan.p_numel + plan.q_numel) + stat_bytes + FRAMING
            forwarded = (sums, sums) if follow == "sums" else whole
        else:
            rounds.append((encoded_size(spec, s, mbs, (layout.numel, dtype), None, stat) + FRAMING,))
            forwarded = whole
        fol.append(forwarded[0])
        alone.append(forwarded[1])
        state.append(STATE_BYTES_PER_PARAM * n_params)
    return WireBytes(len(act) + framing, len(grad) + framing, tuple(rounds), tuple(state), follow=tuple(fol),
                     follow_alone=tuple(alone))


def tokens_per_microbatch(spec: RunSpec) -> int:
    return spec.microbatch_size * spec.seq_len


def ceil_div(a: int, b: int) -> int:
    return -(-a // b) if b else 0


def exponential_lifetime(rng: random.Random, mean_s: float) -> float:
    """A peer's lifetime: exponential with mean `mean_s` (inf: it never leaves)."""
    return math.inf if math.isinf(mean_s) else rng.expovariate(1.0 / mean_s)
