"""The named presets (`tiny` ... `paper8b`, and `small-bpe`: `small` at a BPE's vocabulary), the tuning rules
that `preset` (protocol/spec.py) applies to them (the subspace codec's stage lr from d=512 up, the hybrid's), and
`split_layers`, which re-cuts a preset's layers into another number of stages."""
from __future__ import annotations

from typing import Any

from protocol.spec_choices import SpecError

# The subspace codec's stage lr in the presets (`preset`; docs/fidelity.md 3d-3g, 5): its stages before the last
# at 0.03 x the lr took the gap to dense at 16x from +18.0% to +6.7% at d=512 (two seeds) and from +16.3% to
# +0.1% at d=1024 in 8 stages (one seed; -0.9% and +0.8% on two seeds in the record setting), and the record
# setting's time to dense's loss to 5.2-5.8x sooner; at d=256 it hurt (+7.2% against +4.9%, one seed), hence
# the width from which it applies.
STAGE_LR_FROM_WIDTH = 512
STAGE_LR_SCALE = 0.03
# A hybrid sending at most HYBRID_TUNED_RATIO x fewer numbers than d warms up over 3x the preset's steps (lower loss
# on every seed at small 16x, fidelity.md 3k) and its stages, free, train a little faster than the subspace codec's:
# with that warm-up 0.1 beat 0.03 on 4 of 5 seeds at 16x (+2.0% against +3.6%), on both at 2x the tokens, and tied
# in the record shape; 0.05, 0.15, 0.2 did worse. At ~100x both made it worse (3n), so a narrower hybrid keeps the
# subspace codec's stage lr and the preset's warm-up.
HYBRID_TUNED_RATIO = 16
HYBRID_WARMUP_SCALE = 3
HYBRID_STAGE_LR_SCALE = 0.1

PRESETS: dict[str, dict[str, Any]] = {
    # CPU tests and the laptop demo: seconds per hundred steps.
    "tiny": dict(name="tiny", d_model=128, n_layers=6, n_heads=4, d_ff=256, seq_len=64,
                 stage_layers=(2, 2, 2), rank=16, batch_size=16, microbatch_size=8, lr=3e-3),
    # A real-sized boundary on a CPU box or a small GPU: d=512 (k=32: 16x, bf16 wire).
    "small": dict(name="small", d_model=512, n_layers=8, n_heads=8, d_ff=1376, seq_len=256,
                  stage_layers=(3, 3, 2), rank=32, wire_dtype="bf16", batch_size=32,
                  microbatch_size=8, lr=1e-3, warmup_steps=100),
    # `small` at a real tokenizer's vocabulary (32768: what `swarm tokenizer train` makes by default), the same
    # width and layers, so a fidelity comparison of vocab 256 against 8k/32k changes the vocabulary alone
    # (`preset("small", vocab=8192)` for others; a run on a token folder takes its tokenizer's vocabulary).
    # Its embedding and head hold 2 x 32768 x 512 = 33.6M of its 58.9M parameters, and each subspace stage a
    # T_fixed of 32768 x 512 (64 MiB in fp32, `t_fixed_rows` in peer/runner/memory_estimate.py).
    "small-bpe": dict(name="small-bpe", d_model=512, n_layers=8, n_heads=8, d_ff=1376, seq_len=256,
                      stage_layers=(3, 3, 2), rank=32, wire_dtype="bf16", batch_size=32,
                      microbatch_size=8, lr=1e-3, warmup_steps=100, vocab=32768),
    # GPU-sized: d=2048, k=20 (~100x), one stage per GPU.
    "large": dict(name="large", d_model=2048, n_layers=16, n_heads=16, d_ff=5504, seq_len=1024,
                  stage_layers=(4, 4, 4, 4), rank=20, wire_dtype="bf16", batch_size=32,
                  microbatch_size=4, lr=3e-4, warmup_steps=200),
    # ~1.5B (1.51e9 parameters): d=2048, 30 layers in 6 stages of 5, k=20 (~100x); a stage is ~250M.
    "xl": dict(name="xl", d_model=2048, n_layers=30, n_heads=16, d_ff=5504, seq_len=1024,
               stage_layers=(5,) * 6, rank=20, wire_dtype="bf16", batch_size=16, microbatch_size=2,
               lr=2.5e-4, warmup_steps=200),
    # The public record on slow links' shape (Pluralis' ProtocolNanoGPT: ~203M parameters, d=1024, 8 stages;
    # `swarm bench record`): 16 layers in 8 stages of 2, 2.02e8 parameters with the byte vocabulary,
    # k = d/100 = 10 (~100x, the subspace codec's default ratio), batch 64 x 256 tokens.
    "record": dict(name="record", d_model=1024, n_layers=16, n_heads=16, d_ff=2752, seq_len=256,
                   stage_layers=(2,) * 8, rank=10, wire_dtype="bf16", batch_size=64, microbatch_size=8,
                   lr=7e-4, warmup_steps=100),
    # The paper's largest shape, LLaMA-3-8B's: 32 layers, d=4096, 32 heads (no grouped-query attention
    # here: 7.8e9 parameters), d_ff=14336, 8 stages of 4 layers (~1e9 each), k=40 (~100x). Byte vocabulary,
    # like every preset but small-bpe. A stage fits a 24 GB card with activation checkpointing (docs/consumer-gpus.md).
    "paper8b": dict(name="paper8b", d_model=4096, n_layers=32, n_heads=32, d_ff=14336, seq_len=1024,
                    stage_layers=(4,) * 8, rank=40, wire_dtype="bf16", batch_size=8, microbatch_size=1,
                    lr=1.5e-4, warmup_steps=200),
}


def split_layers(n_layers: int, n_stages: int) -> tuple[int, ...]:
    """Layers per stage, as even as possible, earlier stages taking the remainder."""
    if not 1 <= n_stages <= n_layers:
        raise SpecError(f"cannot cut {n_layers} layers into {n_stages} stages; use 1..{n_layers} stages.")
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (1 if i < extra else 0) for i in range(n_stages))
