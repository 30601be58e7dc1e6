"""How much accelerator memory a stage needs, from the run spec alone (no tensor is built).

A peer checks this before it takes a stage (`swarm/replicas/placement.py`), and
`swarm bench memory` compares it with `torch.cuda.max_memory_allocated`. With e the bytes
of the master dtype (`compute_dtype`: 4 in fp32, bf16 and fp16 runs, 8 in fp64), P the stage's
trainable numbers and N = microbatch_size * seq_len tokens per microbatch:

    weights    = e P
    grads      = e P                       (accumulated over the step's microbatches)
    optimizer  = e (P + P_v)               (exp_avg; exp_avg_sq is one number per column of a
                                            "col" weight and per row of a "row" table: P_v <= P)
    buffers    = e (copies of U [d,k] and T_fixed [V,d] in the codec, the constrained maps and
                    the runner's basis) + the rope tables + 16 d k (the fp64 re-fit statistic)
                 (T_fixed, `t_fixed`: 2 or 3 copies of e V d, 64 MiB each at V = 32768, d = 512 in fp32,
                  256 MiB at V = 131072; built from the seed on every peer, never sent: `t_fixed_rows`)
    activations = m (n_blocks a_block + a_ends) N      (per microbatch, m of them in flight)
    workspace  = the extra at the backward peak, at the optimizer step, or in forward (autocast's
                 bf16 copies of every block weight live until the stage's forward ends)
    sync       = e P_layout                (the flat gradient sum of a replica sync; `replicated`)
    runtime    = cuBLAS's workspaces on CUDA (allocated by torch's allocator at the first matmul)

    peak = weights + optimizer + buffers + runtime + sync
           + max(grads + activations + workspace_bwd, grads + workspace_opt, [grads] + activations + workspace_fwd)

([grads]: only on the last stage, whose next microbatch's forward comes after the previous one's
backward; a non-last stage runs every forward of a step before the first gradient exists.)

m is `spec.max_in_flight` for a non-last stage (the head forwards that many microbatches before
the first gradient comes back, then one more per gradient back: every microbatch of the step
unless `microbatches_in_flight` bounds it; a replica fed by several heads may hold up to that many
times more, never more than the step's) and 1 for the last stage (it runs backward right after
forward).
a_block, bytes per token saved for backward by one block (the tensors autograd keeps, as
`torch.autograd.graph.saved_tensors_hooks` lists them; H heads, d_ff = f):

    fp32/fp64 (c = e), CPU:  (11 d + 4 f) c + 4 H + 2 c  (per norm its input, normalized output and
                             the linear input; q k v and the attention output; the wo input;
                             SwiGLU's four f-wide tensors; the log-sum-exp and the norms' rstd)
                       CUDA: (8 d + 4 f) c + 4 H + 2 c   (`F.rms_norm` is one kernel keeping its input
                             and rstd; the wo input is a view of the attention output)
    bf16 autocast, CPU:      36 d + 8 f + 4 H + 8      (the fp32 norm in/out, a bf16 cast of the
                             normed input per consuming matmul (3 + 2), q k v out and the wo input
                             in bf16, SwiGLU in bf16)
                   CUDA:     28 d + 8 f + 4 H + 8      (the fused norm: no fp32 normalized output)
                   and both: a bf16 cast of every block weight per microbatch (autocast's weight
                             cache lives for one forward only)
    fp16 autocast:           as bf16 (two bytes a number, the same tensors; the loss scale is one float)
    checkpointed:       e d                            (the block's input; the block's activations
                        come back for one microbatch at a time, in the workspace)

The figures are peak *allocated* bytes; a card also needs the CUDA context and allocator
slack (`CARD_OVERHEAD`, `HEADROOM`), which `fits` adds.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from protocol.spec import RunSpec

GIB = 2**30
CARDS_GB = (8, 12, 16, 24, 48, 80)  # common card classes, GiB of memory
CARD_OVERHEAD = GIB // 2  # CUDA context and libraries: memory a card has but the allocator never gets
CUBLAS_WORKSPACES = 64 * 2**20  # cuBLAS and cuBLASLt workspaces (measured on an H100: `swarm bench memory`)
HEADROOM = 1.10  # allocator fragmentation and the estimate's own error
T_FIXED_VOCABS = (256, 32768, 65536, 131072)  # bytes, and real tokenizers' vocabularies (32k-128k)


@dataclass(frozen=True)
class StageMemory:
    """One stage's estimated peak memory, in bytes, part by part (see the module docstring)."""

    stage: int
    params: int  # trainable numbers
    weights: int
    grads: int
    optimizer: int
    buffers: int
    activations: int  # every microbatch in flight
    workspace_backward: int
    workspace_optimizer: int
    workspace_forward: int
    sync: int
    runtime: int
    in_flight: int
    checkpointing: bool
    is_last: bool
    t_fixed: int = 0  # of `buffers`: the stage's copies of the subspace's fixed token table T_fixed [V, d]

    @property
    def resident(self) -> int:
        """What lives through a step whatever runs: weights, moments and buffers."""
        return self.weights + self.optimizer + self.buffers

    @property
    def peak(self) -> int:
        forward = self.activations + self.workspace_forward + (self.grads if self.is_last else 0)
        return self.resident + self.runtime + self.sync + max(
            self.grads + self.activations + self.workspace_backward, self.grads + self.workspace_optimizer, forward)

    def to_dict(self) -> dict:
        return {**asdict(self), "resident": self.resident, "peak": self.peak}


def _elem(spec: RunSpec) -> tuple[int, int, bool]:
    """(master bytes e, compute bytes c, autocast?) of the spec's dtype."""
    if spec.dtype == "fp64":
        return 8, 8, False
    if spec.dtype in ("bf16", "fp16"):  # autocast to a 2-byte dtype over fp32 master weights
        return 4, 2, True
    return 4, 4, False


def _shapes(spec: RunSpec, stage: int) -> dict:
    """Counts of the stage's parameters, by role, as protocol/model.py builds them."""
    d, f, V, k, n = spec.d_model, spec.d_ff, spec.vocab, spec.rank, spec.stage_layers[stage]
    first, last = stage == 0, stage == spec.n_stages - 1
    sub, reparam = spec.codec == "subspace", spec.subspace_mode == "reparam"
    constrained = sub and not last and not spec.hybrid  # wo and w_down keep their outputs in span(U)
    wo = k * d if constrained and reparam else d * d
    w_down = k * f if constrained and reparam else d * f
    block = 3 * d * d + wo + 2 * d * f + w_down + 2 * d
    trained = spec.codec == "bottleneck" or spec.hybrid  # boundaries with a trained encoder and decoder
    b = spec.residual_width if spec.hybrid else spec.rank
    ends = 0
    if first:
        ends += V * k if sub and reparam else V * d
    elif trained:
        ends += b * 4 * b + 4 * b * d
    if spec.embed_split == "per_stage":
        ends += V * d
    if last:
        ends += d + V * d
    elif trained:
        ends += d + d * 4 * b + 4 * b * b
    # numbers of exp_avg_sq: one per column of a "col" weight, one per row of the "row" table
    project = constrained and not reparam
    v_saved = n * ((d * d - d) + (d * f - f)) if project else 0
    table = first and sub and not reparam and not spec.hybrid  # the hybrid's stage-0 table is free
    if table:
        v_saved += V * d - V
    # the replica-sync layout carries constrained gradients in subspace coordinates
    layout_saved = n * ((d * d - k * d) + (d * f - k * f)) if project else 0
    if table:
        layout_saved += V * d - V * k
    matmul_block = 3 * d * d + 2 * d * f + (k * d + k * f if constrained else d * d + d * f)
    return {"block": block, "params": n * block + ends, "v_saved": v_saved, "layout_saved": layout_saved,
            "matmul_block": matmul_block, "largest": max(d * f, V * d, d * d)}


def _block_bytes_per_token(spec: RunSpec, c: int, autocast: bool, fused_norm: bool) -> int:
    d, f, H = spec.d_model, spec.d_ff, spec.n_heads
    if autocast:
        return (28 if fused_norm else 36) * d + 8 * f + 4 * H + 8
    # on CUDA the attention output's transpose back is a view, so the wo input is no extra tensor
    return ((8 if fused_norm else 11) * d + 4 * f) * c + 4 * H + 2 * c


def _ends_bytes_per_token(spec: RunSpec, stage: int, e: int, c: int, autocast: bool, fused_norm: bool) -> int:
    """Per token, what the stage's entry and exit keep for backward beyond the blocks."""
    d, V, w = spec.d_model, spec.vocab, spec.boundary_width
    first, last = stage == 0, stage == spec.n_stages - 1
    out = 8  # the token ids an embedding or T_fixed lookup keeps
    if not first:
        out += w * e  # the received boundary tensor (a leaf that takes a gradient)
        if spec.codec == "bottleneck":
            out += 9 * spec.rank * e  # z, and the decoder's up output and its silu
    if last:
        # final norm (in, normed, rstd), the head's input, log_softmax's fp32 output and the targets
        out += (1 if fused_norm else 2) * d * e + e + (2 * d if autocast else d * c) + 4 * V + 8
    else:
        out += w * e  # the boundary output, kept with its graph until its gradient comes
        if spec.codec == "bottleneck":
            out += 3 * d * e + 8 * spec.rank * e
    return out


def estimate_stage(spec: RunSpec, stage: int, *, device: str = "cuda", checkpointing: bool = False,
                   replicated: bool = False, in_flight: int | None = None) -> StageMemory:
    """Stage `stage`'s peak memory for one training step (see the module docstring).

    `replicated` adds the flat gradient sum a replica sync holds; `in_flight` overrides the
    number of microbatches whose activations a non-last stage keeps. On CUDA `F.rms_norm` is one
    kernel that keeps its input and rstd; elsewhere it also keeps its normalized output."""
    spec.layer_range(stage)  # a stage that does not exist raises SpecError
    e, c, autocast = _elem(spec)
    fused_norm = torch_device_type(device) == "cuda"
    last = stage == spec.n_stages - 1
    d, V, k, T = spec.d_model, spec.vocab, spec.rank, spec.seq_len
    n = spec.stage_layers[stage]
    sh = _shapes(spec, stage)
    P = sh["params"]
    m = 1 if last else (spec.max_in_flight if in_flight is None else in_flight)
    N = spec.microbatch_size * T

    buffers = 2 * T * (spec.head_dim // 2) * e  # rope cos and sin
    t_fixed = 0
    if spec.codec == "subspace":
        copies = 1 + (stage == 0) + (stage > 0) + (not last)  # runner, embedding, decoder, encoder
        buffers += copies * (d * k + V * d) * e
        t_fixed = copies * V * d * e
        if not last and not spec.hybrid:
            buffers += 2 * n * d * k * e  # every constrained map keeps its own U
        if spec.basis_updates and stage > 0:
            buffers += 2 * d * k * 8  # the re-fit statistic and this step's part of it, fp64

    block = _block_bytes_per_token(spec, c, autocast, fused_norm)
    casts = sh["matmul_block"] * 2 if autocast else 0  # bf16 copies of a block's weights, per microbatch
    head_cast = V * d * 2 if autocast and last else 0
    ends = _ends_bytes_per_token(spec, stage, e, c, autocast, fused_norm) * N + head_cast
    if checkpointing:
        per_mb = n * d * e * N + ends
        recompute = block * N + casts  # one block's activations, back for its backward
    else:
        per_mb = n * (block * N + casts) + ends
        recompute = 0
    f, ec = spec.d_ff, c
    # backward: the gradient flowing through a block (fp32 residual, f-wide SwiGLU parts) and one
    # weight's fresh gradient before it is added to .grad (computed in bf16 under autocast, then cast)
    # (checkpointed: the recomputed block's f-wide activations are freed as their gradients appear)
    flowing = N * (2 * d * e + (0 if checkpointing else 3 * f * ec))
    workspace_bwd = recompute + flowing + sh["largest"] * (e + (2 if autocast else 0))
    if last:
        workspace_bwd += 2 * N * V * 4  # dL/dlogits, and the logits' own gradient buffer
    workspace_opt = 2 * sh["largest"] * e  # g*g and the denominator of the largest parameter
    # autocast caches its bf16 weight copies until the stage's forward ends; without checkpointing
    # they are saved for backward anyway (in `activations`)
    workspace_fwd = n * casts + head_cast if checkpointing else 0
    sync = (P - sh["layout_saved"]) * e if replicated else 0
    return StageMemory(stage=stage, params=P, weights=P * e, grads=P * e, optimizer=(2 * P - sh["v_saved"]) * e,
                       buffers=buffers, activations=m * per_mb, workspace_backward=workspace_bwd,
                       workspace_optimizer=workspace_opt, workspace_forward=workspace_fwd, sync=sync,
                       runtime=CUBLAS_WORKSPACES if fused_norm else 0, in_flight=m, checkpointing=checkpointing,
                       is_last=last, t_fixed=t_fixed)


def t_fixed_rows(spec: RunSpec, vocabs: tuple[int, ...] = T_FIXED_VOCABS, **options) -> list[dict]:
    """The subspace's fixed token table T_fixed [V, d] at each vocabulary V of `vocabs` (the spec otherwise
    unchanged), on every stage: its bytes, e V d per copy (`estimate_stage` counts the copies a stage holds:
    the runner's basis, then the embedding on stage 0, the decoder on the others, the encoder on all but the
    last), and their share of the stage's peak. T_fixed is generated on every peer from the run's seed
    (`protocol/subspace.py` `make_basis`) and never sent: peers compare only its hash, with U's, when they join
    (`sent_bytes` 0 whatever V). Empty for a codec other than subspace."""
    if spec.codec != "subspace":
        return []
    rows = []
    for V in vocabs:
        wide = spec.replace(vocab=V)
        for st in estimate_stages(wide, **options):
            rows.append({"vocab": V, "stage": st.stage, "t_fixed": st.t_fixed, "copies": st.t_fixed // max(
                1, V * wide.d_model * _elem(wide)[0]), "peak": st.peak, "share_of_peak": st.t_fixed / st.peak,
                "built_from": "the run's seed (protocol/subspace.py make_basis)", "sent_bytes": 0})
    return rows


def describe_t_fixed(spec: RunSpec, vocabs: tuple[int, ...] = T_FIXED_VOCABS, **options) -> str:
    """`t_fixed_rows` as lines of text: per vocabulary, T_fixed's memory on each stage."""
    rows = t_fixed_rows(spec, vocabs, **options)
    if not rows:
        return f"T_fixed: none ({spec.codec} codec)"
    lines = [f"T_fixed [V, {spec.d_model}] (built from the seed on every peer, never sent):"]
    for V in vocabs:
        per = [r for r in rows if r["vocab"] == V]
        stages = ", ".join(f"stage {r['stage']} {format_bytes(r['t_fixed'])} ({r['share_of_peak']:.0%} of its peak)"
                           for r in per)
        lines.append(f"  V={V}: {stages}")
    return "\n".join(lines)


def torch_device_type(device: str) -> str:
    """"cuda:1" -> "cuda" (without importing torch)."""
    return device.split(":", 1)[0]


def estimate_stages(spec: RunSpec, **options) -> list[StageMemory]:
    return [estimate_stage(spec, s, **options) for s in range(spec.n_stages)]


def card_budget(gib: int) -> int:
    """Bytes the allocator of a `gib` GiB card can hand out: the card less the CUDA context."""
    return gib * GIB - CARD_OVERHEAD


def fits(peak: int, budget: int) -> bool:
    """Whether a stage of estimated `peak` bytes fits `budget` free bytes, with `HEADROOM`."""
    return peak * HEADROOM <= budget


def smallest_card(peak: int) -> int | None:
    """The smallest common card class (GiB) a stage of estimated `peak` bytes fits, or None."""
    return next((gb for gb in CARDS_GB if fits(peak, card_budget(gb))), None)


def format_bytes(n: float) -> str:
    """1536 MiB -> "1.5 GiB": binary units, as cards are sold (an "8 GB" card has 8 GiB)."""
    for unit, size in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def parse_size(text: str) -> int:
    """"8GB", "8GiB", "7.5G", "512MiB", "1e9" -> bytes. Every unit is binary (GB = GiB, MB = MiB), as
    cards are sold and as the card tables count them: `--max-memory 24GB` is a 24 GB card's 24 GiB."""
    units = {"gib": GIB, "gb": GIB, "g": GIB, "mib": 2**20, "mb": 2**20, "m": 2**20,
             "kib": 2**10, "kb": 2**10, "k": 2**10, "b": 1, "": 1}
    t = text.strip().lower().replace(" ", "")
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise ValueError(f"--max-memory must be a size such as 8GB, 8GiB or 512MiB, not {text!r}.")
    return int(value * units[unit])
