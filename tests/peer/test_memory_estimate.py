"""The memory estimate (peer/runner/memory_estimate.py) against what a stage really holds on the CPU.

Measured here: the bytes of every tensor storage a `StageRunner` holds after a step (parameters,
their gradients, the optimizer moments, buffers, the runner's basis and re-fit statistic), plus
every storage autograd saves for backward over the microbatches a stage keeps in flight
(`torch.autograd.graph.saved_tensors_hooks`, each storage once, parameters and buffers left out),
plus the boundary tensors kept with them. That is compared with the estimate's resident + grads +
activations; the transient workspaces (one kernel's temporaries) are not seen this way, and
`swarm bench memory` measures the whole peak on a GPU (docs/consumer-gpus.md).
"""
from __future__ import annotations

import pytest
import torch

from peer.runner.memory_estimate import (
    CARDS_GB,
    GIB,
    card_budget,
    estimate_stage,
    fits,
    format_bytes,
    parse_size,
    smallest_card,
)
from peer.runner.stage import StageRunner
from protocol.spec import PRESETS, preset


def _storages(tensors) -> dict[int, int]:
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors if torch.is_tensor(t)}


def _measure(spec, stage: int) -> int:
    """Held storages after one step, plus the saved activations of the microbatches in flight."""
    runner = StageRunner(spec, stage)
    g = torch.Generator().manual_seed(0)
    B, T, w = spec.microbatch_size, spec.seq_len, spec.boundary_width
    tokens = torch.randint(0, spec.vocab, (B, T + 1), generator=g)
    z_in = None if stage == 0 else torch.randn(B, T, w, generator=g)
    own = _storages([*runner.module.parameters(), *runner.module.buffers()])
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage().data_ptr()
        if key not in own:
            saved[key] = t.untyped_storage().nbytes()
        return t

    kept = 0
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if runner.is_last:  # backward follows each forward: one microbatch in flight
            runner.forward_backward(0, 0, tokens, z_in)
            kept += z_in.numel() * z_in.element_size()
        else:
            for mb in range(spec.n_microbatches):
                out = runner.forward(0, mb, tokens, z_in)
                kept += out.numel() * out.element_size()
                kept += z_in.numel() * z_in.element_size() if z_in is not None else 0
    activations = sum(saved.values()) + kept
    for mb in range(0 if runner.is_last else spec.n_microbatches):
        runner.backward(0, mb, torch.randn(B, T, w, generator=g) * 1e-3)
    for mb in range(1 if runner.is_last else 0, spec.n_microbatches if runner.is_last else 0):
        runner.forward_backward(0, mb, tokens, z_in)
    grads = sum(_storages([p.grad for p in runner.params]).values())
    runner.optimizer_step()  # creates the moments
    held = [*runner.module.parameters(), *runner.module.buffers(),
            *(v for st in runner.optimizer.state.values() for v in st.values()), runner.stat, runner._step_stat]
    if runner.basis is not None:
        held += [runner.basis.U, runner.basis.T_fixed]
    return sum(_storages(held).values()) + grads + activations


@pytest.mark.parametrize("name,dtype", [("tiny", "fp32"), ("tiny", "bf16"), ("tiny", "fp16"), ("tiny", "fp64"),
                                        ("small", "fp32")])
def test_estimate_matches_what_a_stage_holds_on_cpu_within_15_percent(name: str, dtype: str) -> None:
    spec = preset(name, dtype=dtype)
    spec = spec.replace(batch_size=2 * spec.microbatch_size)  # two microbatches in flight: the shape, at half the CPU
    for stage in range(spec.n_stages):
        est = estimate_stage(spec, stage, device="cpu")
        measured = _measure(spec, stage)
        estimated = est.resident + est.grads + est.activations
        assert abs(estimated / measured - 1) < 0.15, (name, dtype, stage, estimated, measured)


@pytest.mark.parametrize("codec,mode,split", [
    ("subspace", "project", "subspace"), ("subspace", "reparam", "subspace"), ("subspace", "project", "per_stage"),
    ("bottleneck", "project", "subspace"), ("dense", "project", "subspace"), ("hybrid", "project", "subspace")])
def test_parameter_count_is_the_built_stage_s(codec: str, mode: str, split: str) -> None:
    hybrid = dict(codec="subspace", rank=12, residual_width=4) if codec == "hybrid" else dict(codec=codec)
    spec = preset("tiny", subspace_mode=mode, embed_split=split, **hybrid)
    for stage in range(spec.n_stages):
        runner = StageRunner(spec, stage)
        assert estimate_stage(spec, stage).params == runner.n_params


def test_every_preset_is_estimated_without_building_it() -> None:
    """The big presets are estimated from their shapes alone (building paper8b would take ~8 GB per stage)."""
    for name in PRESETS:
        spec = preset(name)
        total = sum(estimate_stage(spec, s).params for s in range(spec.n_stages))
        assert total > 0
    xl = sum(estimate_stage(preset("xl"), s).params for s in range(6))
    p8 = sum(estimate_stage(preset("paper8b"), s).params for s in range(8))
    assert 1.4e9 < xl < 1.6e9 and 7.5e9 < p8 < 8.1e9


def test_checkpointing_and_in_flight_change_the_activations_only() -> None:
    spec = preset("large", dtype="bf16")
    plain, ckpt = estimate_stage(spec, 1), estimate_stage(spec, 1, checkpointing=True)
    assert plain.resident == ckpt.resident and ckpt.activations < plain.activations / 10
    one = estimate_stage(spec, 1, in_flight=1)
    assert one.activations * spec.n_microbatches == plain.activations
    assert estimate_stage(spec, 1, replicated=True).sync > 0 == plain.sync


def test_card_classes_and_sizes() -> None:
    assert smallest_card(1 * GIB) == 8 and smallest_card(10 * GIB) == 12 and smallest_card(10**15) is None
    assert fits(card_budget(24) // 2, card_budget(24)) and not fits(card_budget(24), card_budget(24))
    assert CARDS_GB[0] == 8
    assert parse_size("8GiB") == 8 * GIB and parse_size("8GB") == 8 * GIB and parse_size("512MiB") == 2**29
    assert parse_size("7.5G") == int(7.5 * GIB) and parse_size("1e9") == 10**9
    for bad in ("", "8XB", "-1GB", "GB", "0"):
        with pytest.raises(ValueError, match="--max-memory must be a size"):
            parse_size(bad)
    assert format_bytes(1.5 * GIB) == "1.5 GiB"
