"""The RVQ diagnostic (swarm/bench/fidelity/rvq_boundary.py): its codebooks learn (the coding error falls as they move,
and with every added codebook), the gradient is straight-through plus the commitment term, the hybrid's k exact
coordinates stay exact, and the fidelity bench trains each variant at the bytes it reports."""
from __future__ import annotations

import math

import pytest
import torch

from peer.runner.pipeline import InProcessPipeline
from protocol.codecs import HybridDecoder
from swarm.bench.fidelity.plan import plan_shape
from swarm.bench.fidelity.rvq_boundary import RVQ_BOUNDARIES, ResidualVQ, RVQHybridEncoder, rvq_boundaries
from swarm.bench.fidelity.train import Job, train_job


def _mixture(n: int, e: int, seed: int) -> torch.Tensor:
    """n points around 64 centres in R^e: structure a codebook can find and a random start misses in part."""
    centres = torch.randn(64, e, generator=torch.Generator().manual_seed(1234)) * 3.0
    g = torch.Generator().manual_seed(seed)
    return centres[torch.randint(64, (n,), generator=g)] + 0.3 * torch.randn(n, e, generator=g)


def _error(vq: ResidualVQ, x: torch.Tensor) -> float:
    q, _ = vq.quantize(x, learn=False)
    return float(((x - q) ** 2).sum(dim=1).mean() / (x ** 2).sum(dim=1).mean())


def test_codebooks_learn_and_each_added_codebook_codes_more():
    e = 8
    errors = {}
    for m in (1, 2, 4):
        vq = ResidualVQ(e, m, seed=1, k=32, decay=0.8)
        vq.quantize(_mixture(2048, e, 0), learn=True)  # the data start
        start = _error(vq, _mixture(4096, e, 99))
        for step in range(1, 40):
            vq.quantize(_mixture(2048, e, step), learn=True)
        errors[m] = _error(vq, _mixture(4096, e, 99))  # held-out points of the same mixture
        assert errors[m] < 0.8 * start, (m, start, errors[m])  # EMA k-means moved the codewords somewhere better
        _, codes = vq.quantize(_mixture(4096, e, 99), learn=False)
        assert codes.dtype == torch.uint8 and codes.shape == (4096, m)
        assert len(torch.unique(codes[:, 0])) > 16  # no collapse onto a few codewords
    assert errors[4] < errors[2] < errors[1]


def test_the_gradient_is_straight_through_plus_commitment():
    vq = ResidualVQ(4, 2, seed=0, k=8, beta=0.5, tokens_per_step=10)
    y = torch.randn(10, 4, dtype=torch.float64, requires_grad=True)
    vq.quantize(y, learn=True)
    vq.learning = False
    out = vq(y)
    q, _ = vq.quantize(y, learn=False)
    assert torch.allclose(out.detach(), q.to(out.dtype))
    w = torch.randn(10, 4, dtype=torch.float64)
    (out * w).sum().backward()
    assert torch.allclose(y.grad, w + 2 * 0.5 / 10 * (y.detach() - q.to(y.dtype)), atol=1e-12)


def _hybrid(**kw):
    return plan_shape("smoke").base.replace(rank=4, residual_width=8, **kw)


def test_the_k_exact_coordinates_stay_exact_through_the_codes():
    spec = _hybrid(wire_dtype="fp32")
    pipe = InProcessPipeline(spec, serialize=False)
    rvq_boundaries(pipe, "rvq4")
    enc, dec = pipe.runners[0].module.encoder, pipe.runners[1].module.decoder
    assert isinstance(enc, RVQHybridEncoder) and isinstance(dec, HybridDecoder)
    with torch.no_grad():  # the bottleneck's outputs start at zero: move them, so that the e numbers carry something
        for p in list(enc.hybrid.enc.parameters()) + list(dec.dec.parameters()):
            p.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(3)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:  # 1,024 tokens: more than a codebook's 256 codewords
        return (torch.randint(spec.vocab, (64, spec.seq_len), generator=g),
                torch.randn(64, spec.seq_len, spec.d_model, generator=g, requires_grad=True))

    first_tokens, first_h = batch()
    enc(first_h, first_tokens)  # a grad-enabled call: the first one starts the codebooks, from other points than h's
    assert bool(enc.vq.started)
    enc.vq.learning = False  # codebooks held still, so that z's codes and q below are the same codes
    tokens, h = batch()
    z = enc(h, tokens)
    U, T = enc.hybrid.U, enc.hybrid.T_fixed
    rebuilt = dec(z.detach(), tokens)
    coords = (rebuilt - T[tokens]) @ U
    assert torch.allclose(coords, ((h - T[tokens]) @ U).detach(), atol=1e-4)  # what span(U) passes, exactly
    y = enc.hybrid(h, tokens)[..., 4:].detach()
    q, _ = enc.vq.quantize(y, learn=False)
    assert torch.allclose(z[..., 4:].detach(), q)  # the e numbers are their codes' reconstruction
    assert float((q - y).norm()) > 0  # and lossy


def test_fidelity_jobs_train_each_rvq_variant_at_its_bytes():
    base = _hybrid()
    for variant, m in RVQ_BOUNDARIES.items():
        res = train_job(Job(variant, "rvq", base, boundary=variant), None, eval_every=4, eval_batches=2,
                        log=lambda *_: None)
        assert res.steps == base.total_steps and math.isfinite(res.final_val) and not res.error
        assert res.compression == pytest.approx(base.d_model * 2 / (base.rank * 2 + m))
    with pytest.raises(ValueError, match="hybrid"):
        rvq_boundaries(InProcessPipeline(base.replace(residual_width=0), serialize=False), "rvq8")
    with pytest.raises(ValueError, match="unknown RVQ boundary"):
        rvq_boundaries(InProcessPipeline(base, serialize=False), "rvq3")
