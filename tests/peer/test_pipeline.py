"""The oracle: the in-process pipeline (real wire bytes at every boundary) against the one-process
reference, step by step (docs/algorithms.md section 3 tests 11, 12), and lossless subspace compression.

About the lossless check (compressed vs uncompressed model, 1e-10 over 100 steps): training
is chaotic. At the tiny preset's lr 3e-3 a 1e-15 relative nudge of the *uncompressed* model's
weights grows to ~1e-3 relative loss difference by step 100 (measured), so no implementation
could meet 1e-10 there. At lr 1e-3 the same nudge stays below 1e-11, and that is the lr used.
"""
from __future__ import annotations

import json
import time

import pytest
import torch

from peer.data.batches import BatchSource, unigram_entropy_nats
from peer.data.corpus import load_corpus
from peer.runner.pipeline import InProcessPipeline
from protocol.codecs import WirePacker
from protocol.reference import ReferenceModel
from protocol.spec import preset
from protocol.subspace import project_cols
from protocol.wire import ActivationMessage, Header, header_bytes, tokens_for_wire

SEQ = 32



@pytest.fixture(scope="module")
def corpus():
    return load_corpus(None, seq_len=SEQ)


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=SEQ, n_layers=2, stages=2, batch_size=8,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64", lr=1e-3)
    base.update(kw)
    return preset("tiny", **base)


def params(models):
    return [p.detach() for m in models for p in m.parameters()]


def rel(a, b):
    return abs(a - b) / abs(b)


def run_side_by_side(spec, corpus, steps, lossless=False):
    src = BatchSource(corpus, spec.seq_len, spec.microbatch_size, seed=7)
    pipe, ref = InProcessPipeline(spec), ReferenceModel(spec, boundary=True)
    dense = ReferenceModel(spec, boundary=False) if lossless else None
    lp, lr_, ld = [], [], []
    for step in range(steps):
        lp.append(pipe.train_step(step, src.microbatch).loss)
        lr_.append(ref.train_step(src.microbatch))
        if dense is not None:
            ld.append(dense.train_step(src.microbatch))
    return pipe, ref, dense, lp, lr_, ld


ORACLE = {  # name: (spec overrides, steps, lossless check)
    "subspace-2-project": (dict(), 100, True),
    "subspace-4-project": (dict(stages=4, n_layers=4), 100, True),
    "subspace-2-reparam": (dict(subspace_mode="reparam"), 100, True),
    "subspace-3-reparam": (dict(subspace_mode="reparam", stages=3, n_layers=3), 30, True),
    "subspace-3-per-stage-tables": (dict(embed_split="per_stage", stages=3, n_layers=3), 30, True),
    # docs/fidelity.md 3d: lr multipliers of the constrained stages / weights, a larger frozen token code
    "subspace-3-lr-scales": (dict(constrained_lr_scale=4.0, constrained_stage_lr_scale=0.5, stages=3, n_layers=3),
                             30, True),
    "subspace-2-t-fixed-std": (dict(t_fixed_std=0.3), 30, True),
    # docs/fidelity.md 3p: the stage lr ramped from x0.5 to x2 between the warm-up's end and total_steps
    "subspace-3-stage-lr-ramp": (dict(constrained_stage_lr_scale=0.5, constrained_stage_lr_end=2.0, warmup_steps=5,
                                      total_steps=30, stages=3, n_layers=3), 30, True),
    "bottleneck-2": (dict(codec="bottleneck"), 100, False),
    # issue 24's hybrid: k exact coordinates and a bottleneck of the rest, free stages (lossy: no lossless check)
    "hybrid-3": (dict(residual_width=4, basis_updates=False, stages=3, n_layers=3), 40, False),
    "dense-2": (dict(codec="dense"), 20, False),
}


@pytest.mark.parametrize("name", sorted(ORACLE))
def test_pipeline_equals_reference_fp64(name, corpus):
    over, steps, lossless = ORACLE[name]
    spec = small(**over)
    pipe, ref, dense, lp, lr_, ld = run_side_by_side(spec, corpus, steps, lossless)
    assert lp == lr_  # bit-equal, every step
    assert all(torch.equal(a, b) for a, b in zip(params(r.module for r in pipe.runners), params(ref.stages)))
    assert lp[-1] < lp[0] - 0.5  # it trained
    if lossless:  # compression is lossless: same trajectory as the uncompressed constrained model
        assert max(rel(a, b) for a, b in zip(lr_, ld)) < 1e-10
        for a, b in zip(params(ref.stages), params(dense.stages)):
            assert float((a - b).norm() / b.norm()) < 1e-9
    # bytes: every forward message is B*T*w*e + B*(T+1) + header (fp64 wire, uint8 ids)
    n_msgs = steps * spec.n_microbatches * (spec.n_stages - 1)
    assert pipe.wire.forward_messages == pipe.wire.backward_messages == n_msgs
    per_msg = pipe.wire.forward_bytes / n_msgs
    data = spec.microbatch_size * (SEQ * spec.boundary_width * 8 + (SEQ + 1))
    assert data < per_msg <= data + 160


def test_pipeline_equals_reference_fp32(corpus):
    spec = small(dtype="fp32", wire_dtype="fp32")
    _, _, _, lp, lr_, _ = run_side_by_side(spec, corpus, 100)
    assert max(rel(a, b) for a, b in zip(lp, lr_)) < 1e-5


@pytest.mark.parametrize("wire,quant,dtype", [("bf16", "none", "fp64"), ("fp32", "int8", "fp64"),
                                               ("bf16", "int8", "fp32")])
def test_pipeline_equals_reference_lossy_wire(wire, quant, dtype, corpus):
    """The reference applies the same wire rounding (forward values and backward gradients)."""
    spec = small(wire_dtype=wire, quant=quant, dtype=dtype)
    pipe, ref, _, lp, lr_, _ = run_side_by_side(spec, corpus, 30)
    assert max(rel(a, b) for a, b in zip(lp, lr_)) < 1e-5
    for a, b in zip(params(r.module for r in pipe.runners), params(ref.stages)):
        assert float((a - b).norm() / b.norm()) < 1e-5
    # and the wire really was lossy: an exact-wire run ends elsewhere
    exact = ReferenceModel(spec.replace(wire_dtype="fp64", quant="none"))
    src = BatchSource(corpus, SEQ, spec.microbatch_size, seed=7)
    le = [exact.train_step(src.microbatch) for _ in range(30)]
    assert max(rel(a, b) for a, b in zip(lr_, le)) > 1e-6


def test_lossless_check_can_fail(corpus):
    """Negative control: with one W_o pushed off S by 1e-3 (in both models alike), the compressed
    and the uncompressed model disagree, far above the lossless tolerance."""
    spec = small()
    comp, dense = ReferenceModel(spec, boundary=True), ReferenceModel(spec, boundary=False)
    U = comp.optimizers[0].U
    g = torch.Generator().manual_seed(0)
    R = torch.randn(spec.d_model, spec.d_model, generator=g, dtype=torch.float64)
    R = R - project_cols(R, U)
    for m in (comp, dense):
        W = m.stages[0].blocks[0].wo.weight
        with torch.no_grad():
            W.add_(R / R.norm() * 1e-3 * W.norm())
    tok = BatchSource(corpus, SEQ, 4, seed=7).microbatch(0, 0)
    with torch.no_grad():
        assert rel(float(comp.loss(tok)), float(dense.loss(tok))) > 1e-8


@pytest.mark.parametrize("dtype", ["fp64", "bf16"])
def test_wire_message_sizes_match_header_bytes(dtype, corpus):
    """The pipeline's byte count is the sum of real buffers: k numbers and one id per token,
    whatever the compute dtype."""
    spec = small(wire_dtype="bf16", dtype=dtype)
    pipe = InProcessPipeline(spec)
    src = BatchSource(corpus, SEQ, spec.microbatch_size, seed=7)
    pipe.train_step(0, src.microbatch)
    msg = ActivationMessage(Header(spec.run_hash, 0, 0, 0, spec.codec, 1),
                            tokens_for_wire(src.microbatch(0, 0), 256),
                            WirePacker.for_spec(spec).pack(torch.zeros(4, SEQ, spec.rank)))
    per = spec.microbatch_size * (SEQ * spec.rank * 2 + SEQ + 1) + header_bytes(msg)
    assert pipe.wire.forward_bytes == spec.n_microbatches * per
    pt = pipe.wire.per_token()
    assert pt["forward_bytes_per_token"] == pytest.approx(per / (4 * SEQ))
    assert pt["backward_bytes_per_token"] < pt["forward_bytes_per_token"]  # no ids on the way back


# steps per codec: each one's bound below holds from about 70 (dense), 105 (bottleneck) and 160
# (subspace) steps on; more would prove nothing more and cost a fast lane half a minute
# steps each codec gets to reach the bound. fp32 training rounds differently on different CPUs' vector units and
# the trajectory is chaotic: on an AVX-512 Xeon (2026-12-02) subspace's mean loss of steps 181-200 was 2.70 against
# the 2.61 allowed (the same code had passed at 200 on the machines it was set on), 2.53 at 240 and 2.49 at 260
LEARNS_WITHIN = {"dense": 100, "bottleneck": 140, "subspace": 260}


@pytest.mark.e2e  # a training run to a loss bound per codec (tens of seconds each on 2 cores)
@pytest.mark.parametrize("codec", list(LEARNS_WITHIN))
def test_tiny_preset_learns_the_corpus_with_every_codec(tmp_path, corpus, codec):
    """The real `tiny` preset (fp32) learns the embedded corpus with each codec through the pipeline."""
    started, steps = time.perf_counter(), LEARNS_WITHIN[codec]
    spec = preset("tiny", codec=codec)
    data = load_corpus(None, seq_len=spec.seq_len)
    src = BatchSource(data, spec.seq_len, spec.microbatch_size, seed=spec.data_seed)
    pipe = InProcessPipeline(spec)
    curve = [pipe.train_step(step, src.microbatch).loss for step in range(steps)]
    entropy = unigram_entropy_nats(data.train)
    out = tmp_path / "curve.json"
    out.write_text(json.dumps({"entropy_nats": entropy, "seconds": time.perf_counter() - started, codec: curve}))
    back = json.loads(out.read_text())[codec]
    assert len(back) == steps
    final = sum(back[-20:]) / 20
    assert final < 0.8 * entropy, (codec, final, entropy)
    assert final < back[0] - 1.0


def test_bf16_pipeline_against_fp64_reference(corpus):
    """bf16 compute (fp32 master weights, fp32 wire): the pipeline equals the bf16 reference bit for bit,
    the compressed model follows the uncompressed bf16 one, and both stay within 1e-3 relative
    (u_bf16 / 4) of the fp64 reference's losses for 10 steps; the bytes are the formula's."""
    spec = small(dtype="bf16", wire_dtype="fp32")
    pipe, ref, dense, lp, lr_, ld = run_side_by_side(spec, corpus, 10, lossless=True)
    exact = ReferenceModel(spec.replace(dtype="fp64", wire_dtype="fp64"))
    src = BatchSource(corpus, SEQ, spec.microbatch_size, seed=7)
    l64 = [exact.train_step(src.microbatch) for _ in range(10)]
    assert lp == lr_
    assert max(rel(a, b) for a, b in zip(lr_, ld)) < 1e-3
    assert max(rel(a, b) for a, b in zip(lp, l64)) < 1e-3
    assert max(rel(a, b) for a, b in zip(lp, l64)) > 1e-7  # bf16 really ran: fp64 ends elsewhere
    assert lp[-1] < lp[0] - 0.2
    n_msgs = 10 * spec.n_microbatches * (spec.n_stages - 1)
    data = spec.microbatch_size * (SEQ * spec.rank * 4 + (SEQ + 1))
    assert data < pipe.wire.forward_bytes / n_msgs <= data + 160
