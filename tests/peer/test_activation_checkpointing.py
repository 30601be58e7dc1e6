"""Activation checkpointing per block recomputes the same operations on the same inputs: a
three-stage fp64 run with it equals the run without it (losses and every weight after three
steps), and it keeps far fewer tensors for backward."""
from __future__ import annotations

import torch

from peer.runner.stage import StageRunner
from protocol.spec import preset

SPEC = preset("tiny", dtype="fp64", wire_dtype="fp64")


def _run(checkpointing: bool) -> tuple[list[float], list[torch.Tensor], int]:
    runners = [StageRunner(SPEC, s, checkpointing=checkpointing) for s in range(SPEC.n_stages)]
    g = torch.Generator().manual_seed(0)
    losses, saved = [], 0

    def count(t: torch.Tensor) -> torch.Tensor:
        nonlocal saved
        saved += t.numel() * t.element_size()
        return t

    for step in range(3):
        for mb in range(SPEC.n_microbatches):
            tokens = torch.randint(0, SPEC.vocab, (SPEC.microbatch_size, SPEC.seq_len + 1), generator=g)
            with torch.autograd.graph.saved_tensors_hooks(count, lambda t: t):
                z = runners[1].forward(step, mb, tokens, runners[0].forward(step, mb, tokens))
            loss, grad = runners[2].forward_backward(step, mb, tokens, z)
            runners[0].backward(step, mb, runners[1].backward(step, mb, grad))
            losses.append(loss)
        for r in runners:
            r.optimizer_step()
    return losses, [p.detach().clone() for r in runners for p in r.params], saved


def test_a_checkpointed_fp64_run_equals_the_plain_one_and_saves_less():
    plain_losses, plain_weights, plain_saved = _run(False)
    ckpt_losses, ckpt_weights, ckpt_saved = _run(True)
    assert max(abs(a - b) for a, b in zip(plain_losses, ckpt_losses)) <= 1e-10
    assert max(float((a - b).abs().max()) for a, b in zip(plain_weights, ckpt_weights)) <= 1e-10
    assert ckpt_saved < plain_saved / 4
