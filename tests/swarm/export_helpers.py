"""Shared by the export tests: a `tiny` run trained in process, its checkpoints, and a relative error."""
from __future__ import annotations

from pathlib import Path

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.spec import RunSpec, preset
from protocol.subspace import SubspaceBasis, orthonormalize
from swarm.export.gather import StageState, select_stages


def batch_source(spec: RunSpec) -> BatchSource:
    return BatchSource(load_corpus(None, seq_len=spec.seq_len), spec.seq_len, spec.microbatch_size, spec.data_seed)


def trained(spec: RunSpec, steps: int = 3, switch_at: int | None = None) -> InProcessPipeline:
    """`spec` trained `steps` steps in process; with `switch_at`, every stage moves to a new basis
    (version 1, U rotated away from the seed's) before that step."""
    src, pipe = batch_source(spec), InProcessPipeline(spec)
    for step in range(steps):
        if step == switch_at:
            old = pipe.runners[0].basis
            g = torch.Generator().manual_seed(7)
            U = orthonormalize(old.U.double() + 0.3 * torch.randn(old.U.shape, generator=g, dtype=torch.float64))
            pipe.switch_basis(SubspaceBasis(U.to(old.U.dtype), old.T_fixed, old.version + 1))
        pipe.train_step(step, src.microbatch)
    return pipe


def tiny(codec: str = "subspace", **overrides) -> RunSpec:
    return preset("tiny", codec=codec, stages=3, **overrides)


def save_checkpoints(pipe: InProcessPipeline, folder: Path, stages: list[int] | None = None) -> list[Path]:
    """What `swarm peer --checkpoint-dir` writes when a peer stops, for the given stages."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for r in pipe.runners:
        if stages is None or r.stage in stages:
            out.append(folder / f"{r.spec.run_hash}-stage{r.stage}.pt")
            torch.save(r.state_dict(), out[-1])
    return out


def gathered(pipe: InProcessPipeline):
    return select_stages([StageState(r.state_dict(), f"runner {r.stage}") for r in pipe.runners])


def runner_logits(pipe: InProcessPipeline, tokens: torch.Tensor) -> torch.Tensor:
    """The training modules themselves chained through their codecs: what the pipeline computes."""
    with torch.no_grad():
        z = None
        for r in pipe.runners:
            z = r.module(tokens, z)
    return z


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|."""
    return float((a.double() - ref.double()).abs().max() / ref.double().abs().max())


def fixed_tokens(spec: RunSpec, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, spec.vocab, (batch, spec.seq_len), generator=torch.Generator().manual_seed(0))
