"""One job of `swarm bench fidelity`: train one run spec in process and measure its held-out loss.

The in-process pipeline (`peer/runner/pipeline.py`, `serialize=False`) is what the networked swarm
computes step for step, basis re-fits included (tests/e2e/test_basis_updates.py), so a job's
loss is the loss a swarm with this spec would reach. A job stops early, marked `truncated`,
when its deadline passes, so a whole bench fits a time budget; its last held-out loss is
then measured at the step it reached.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.codecs import DenseDecoder, DenseEncoder, SubspaceEncoder
from protocol.spec import WIRE_DTYPES, RunSpec

from .learned_boundary import LEARNED_BOUNDARIES, learned_boundaries
from .rvq_boundary import RVQ_BOUNDARIES, rvq_boundaries, rvq_forward_bytes


@dataclass
class Job:
    """One training run of the bench: a spec, a name to show and the group it is compared in."""

    name: str
    group: str
    spec: RunSpec
    priority: int = 0  # lower runs first
    note: str = ""
    # "codec": the spec's boundaries; "full" (a bench-only diagnostic, not a run spec option): every boundary
    # sends the whole residual h (identity encoder and decoder) while the stages keep their subspace
    # constraint: the constrained model without its compression (protocol/reference.py, boundary=False)
    boundary: str = "codec"

    @property
    def tokens(self) -> int:
        return self.spec.total_steps * self.spec.batch_size * self.spec.seq_len

    @property
    def key(self) -> str:
        return f"{self.group}/{self.name}"

    def compression(self) -> float:
        """Payload bytes per token across a boundary, dense (in the same wire dtype) over this job's:
        d e / (w e' + s), e' = 1 byte with int8 and s its per-token scale (d / k for a bf16 subspace)."""
        spec = self.spec
        if self.boundary == "full":
            return 1.0
        e = WIRE_DTYPES[spec.wire_dtype].itemsize
        if self.boundary in RVQ_BOUNDARIES:
            return spec.d_model * e / rvq_forward_bytes(spec, self.boundary)
        width = spec.rank if self.boundary in LEARNED_BOUNDARIES else spec.boundary_width
        mine = width * (1 if spec.quant == "int8" else e) + (e if spec.quant == "int8" else 0)
        return spec.d_model * e / mine


@dataclass
class JobResult:
    name: str
    group: str
    spec: dict
    note: str
    compression: float
    steps: int  # steps actually trained
    tokens: int
    final_val: float
    val: list[list[float]] = field(default_factory=list)  # [[tokens, held-out loss], ...]
    train_tail: float = math.nan  # mean training loss over the last 5% of steps
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    truncated: bool = False
    switches: int = 0  # basis switches taken
    truncation: float = 0.0  # mean truncated energy of the constrained weights per switch
    device: str = "cpu"
    error: str = ""
    boundary: str = "codec"  # Job.boundary
    # subspace codec: per boundary, mean over held-out tokens of ||h - T_fixed[tok]|| / ||T_fixed[tok]||, what
    # the stages before it wrote into span(U) against the frozen token code beside it, at the last evaluation
    write_ratio: list[float] = field(default_factory=list)


def full_width_boundaries(pipe: InProcessPipeline) -> None:
    """Every boundary of `pipe` sends h itself, in the wire dtype: identity encoders and decoders, the
    stages (their constraint, optimizer and embedding) as the spec built them. With basis re-fits off,
    for a subspace spec this is the constrained model without the compression."""
    if pipe.spec.basis_updates:
        raise ValueError("full-width boundaries need a fixed basis (basis_updates false): the re-fit statistics "
                         "are taken at the subspace decoder.")
    d = pipe.spec.d_model
    for r in pipe.runners:
        if not r.is_last:
            r.module.encoder = DenseEncoder(d)
        if not r.is_first:
            r.module.decoder = DenseDecoder(d)


@torch.no_grad()
def held_out_loss(pipe: InProcessPipeline, batches: list[torch.Tensor], ratios: list[float] | None = None) -> float:
    """Mean loss on fixed validation windows, through the same boundaries (codec and wire dtype).
    `ratios` (a subspace run with its own codec) is filled with `JobResult.write_ratio`."""
    total = 0.0
    sums = [0.0] * (len(pipe.runners) - 1)
    for tokens in batches:
        tokens = tokens.to(pipe.runners[0].device)
        z = None
        for i, r in enumerate(pipe.runners):
            z = r.module(tokens[:, :-1], z)
            if not r.is_last:
                enc = r.module.encoder
                if isinstance(enc, SubspaceEncoder):  # z = (h - T_fixed[tok]) U: ||z|| = ||h - T_fixed[tok]||
                    sums[i] += float((z.norm(dim=-1) / enc.T_fixed[tokens[:, :-1]].norm(dim=-1)).mean())
                z = pipe.packer.roundtrip(z)
        total += float(torch.nn.functional.cross_entropy(z.reshape(-1, z.shape[-1]).float(),
                                                         tokens[:, 1:].reshape(-1)))
    if ratios is not None and isinstance(getattr(pipe.runners[0].module, "encoder", None), SubspaceEncoder):
        ratios[:] = [x / len(batches) for x in sums]
    return total / len(batches)


def train_job(job: Job, data: str | None, device: str = "cpu", eval_every: int = 0, eval_batches: int = 16,
              deadline: float | None = None, log=print) -> JobResult:
    """Train `job.spec.total_steps` steps (fewer if the wall clock passes `deadline`, a `time.time()`)."""
    spec = job.spec
    if device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    corpus = load_corpus(data, seq_len=spec.seq_len)
    src = BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed)
    val = src.val_batches(eval_batches)
    pipe = InProcessPipeline(spec, device=device, serialize=False)
    if job.boundary == "full":
        full_width_boundaries(pipe)
    elif job.boundary in LEARNED_BOUNDARIES:
        learned_boundaries(pipe, job.boundary)
    elif job.boundary in RVQ_BOUNDARIES:
        rvq_boundaries(pipe, job.boundary)
    steps, per_step = spec.total_steps, spec.batch_size * spec.seq_len
    eval_every = eval_every or max(1, steps // 10)
    res = JobResult(job.name, job.group, spec.to_dict(), job.note, job.compression(), 0, 0, math.nan, device=device,
                    boundary=job.boundary)
    losses: list[float] = []
    truncations: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        losses.append(pipe.train_step(step, src.microbatch).loss)
        last = pipe.runners[-1]
        if last.basis is not None and last.basis_version > 0 and last.basis_updated_step == step + 1:
            truncations.append(max(r.last_truncation for r in pipe.runners))
        done = step + 1
        if not math.isfinite(losses[-1]):
            res.error = f"the training loss became {losses[-1]} at step {done}"
            break
        late = deadline is not None and time.time() > deadline
        if done % eval_every == 0 or done == steps or late:
            res.val.append([done * per_step, held_out_loss(pipe, val, res.write_ratio)])
            log(f"{job.name:>34} step {done:5d}/{steps}: val {res.val[-1][1]:.4f} "
                f"({time.perf_counter() - t0:.0f} s)")
        if late and done < steps:
            res.truncated = True
            break
    res.steps = len(losses)
    res.tokens = res.steps * per_step
    res.seconds = time.perf_counter() - t0
    res.tokens_per_second = res.tokens / max(res.seconds, 1e-9)
    tail = losses[-max(1, len(losses) // 20):]
    res.train_tail = sum(tail) / len(tail)
    res.final_val = res.val[-1][1] if res.val else math.nan
    res.switches, res.truncation = len(truncations), (sum(truncations) / len(truncations) if truncations else 0.0)
    return res
