"""The constrained model and its boundaries (docs/algorithms.md 1.2-1.3, 2; section 3 tests 2, 3, 4, 7, 12)."""
from __future__ import annotations

import pytest
import torch

from protocol.bottleneck import ResBMDecoder, ResBMEncoder
from protocol.codecs import WirePacker
from protocol.model import SubspaceEmbedding, SubspaceLinear, build_stage, spec_basis
from protocol.spec import SpecError, preset
from protocol.subspace import out_of_subspace, project_cols

F64 = torch.float64


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=32, n_layers=3, stages=3, batch_size=8,
                microbatch_size=4, rank=8, dtype="fp64", wire_dtype="fp64")
    base.update(kw)
    return preset("tiny", **base)


def tokens(spec, B=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, spec.vocab, (B, spec.seq_len), generator=g)


def hidden_states(spec, stages, tok):
    """(h at the end of each non-last stage, the boundary tensor it sends), chaining through the codec."""
    out, z = [], None
    for m in stages[:-1]:
        h = m.body(m.enter(tok, z))
        z = m.leave(h, tok)
        out.append((h.detach(), z.detach()))
    return out


def activation_in_subspace(h, tok, basis):
    """Test 3: ||(I-P)(h - T_fixed[tok])|| / ||h - T_fixed[tok]|| over all tokens."""
    r = (h - basis.T_fixed[tok]).reshape(-1, h.shape[-1])
    return out_of_subspace(r, basis.U, rows=True)


def reconstruction_error(spec, stages, tok, packer):
    """Test 4: relative error of decode(wire(encode(h))) against h, at every boundary."""
    errs = []
    for s, (h, z) in enumerate(hidden_states(spec, stages, tok)):
        h_rec = stages[s + 1].enter(tok, packer.roundtrip(z)).detach()
        errs.append(float((h_rec - h).norm() / h.norm()))
    return max(errs)


def push_off_subspace(W, U, rel, seed=0):
    """W + rel*||W|| * (unit direction outside span(U)), in place."""
    g = torch.Generator().manual_seed(seed)
    R = torch.randn(W.shape, generator=g, dtype=W.dtype)
    R = R - project_cols(R, U)
    with torch.no_grad():
        W.add_(R / R.norm() * rel * W.norm())


@pytest.mark.parametrize("mode", ["project", "reparam"])
@pytest.mark.parametrize("dtype,tol", [("fp64", 1e-12), ("fp32", 1e-6)])
def test_constrained_weights_in_subspace(mode, dtype, tol):
    """Test 2, both subspace modes: every constrained map of a non-last stage keeps its output in S."""
    spec = small(subspace_mode=mode, dtype=dtype, wire_dtype=dtype)
    basis = spec_basis(spec)
    for s in range(spec.n_stages - 1):
        m = build_stage(spec, s, basis)
        named = m.constrained_weights()
        # two blocks' W_o and W_down per layer, plus T_S on stage 0
        assert len(named) == 2 * len(spec.layer_range(s)) + (1 if s == 0 else 0)
        for name, W, rows in named:
            assert rows == name.endswith("embed")
            assert float(W.detach().norm()) > 0
            assert out_of_subspace(W.detach(), basis.U, rows=rows) < tol, name
        assert len(m.constrained_parameters()) == (len(named) if mode == "project" else 0)
    last = build_stage(spec, spec.n_stages - 1, basis)
    assert last.constrained_weights() == [] and last.constrained_parameters() == []
    assert not any(isinstance(mod, (SubspaceLinear, SubspaceEmbedding)) for mod in last.modules())
    # the free last stage: a random W_o is mostly outside S
    assert out_of_subspace(last.blocks[0].wo.weight.detach(), basis.U) > 0.5


def test_stages_rebuild_bit_identical():
    spec = small()
    for s in range(spec.n_stages):
        a, b = build_stage(spec, s).state_dict(), build_stage(spec, s).state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = build_stage(spec.replace(seed=1), 1).state_dict()
    mine = build_stage(spec, 1).state_dict()
    assert not torch.equal(other["blocks.0.wq.weight"], mine["blocks.0.wq.weight"])
    # U and T_fixed come from the seed, never from a checkpoint
    assert not any(k.endswith(("U", "T_fixed")) for k in mine)


@pytest.mark.parametrize("mode", ["project", "reparam"])
@pytest.mark.parametrize("dtype,tol", [("fp64", 1e-12), ("fp32", 1e-6)])
def test_boundary_activations_in_subspace(mode, dtype, tol):
    """Test 3: h - T_fixed[tok] lies in S at every boundary (stage 1 starts from a decoded boundary)."""
    spec = small(subspace_mode=mode, dtype=dtype, wire_dtype=dtype)
    basis = spec_basis(spec)
    stages = [build_stage(spec, s, basis) for s in range(spec.n_stages)]
    tok = tokens(spec)
    with torch.no_grad():
        for h, z in hidden_states(spec, stages, tok):
            assert z.shape == (4, spec.seq_len, spec.rank)
            assert activation_in_subspace(h, tok, basis) < tol
            # and the blocks did move h inside S: not a vacuous check on h = T_fixed[tok]
            assert float((h - basis.T_fixed[tok]).norm() / h.norm()) > 0.1


@pytest.mark.parametrize("wire,quant,tol", [("fp64", "none", 1e-12), ("fp32", "none", 1e-6),
                                             ("bf16", "none", 2e-3), ("bf16", "int8", 1e-2)])
def test_reconstruction_error(wire, quant, tol):
    """Test 4: decode(wire(encode(h))) = h; exact in fp64, rounding-limited otherwise."""
    spec = small(wire_dtype=wire, quant=quant)
    stages = [build_stage(spec, s) for s in range(spec.n_stages)]
    with torch.no_grad():
        err = reconstruction_error(spec, stages, tokens(spec), WirePacker.for_spec(spec))
    assert err < tol
    if wire != "fp64":
        assert err > 1e-9  # the wire rounding is really applied


def test_negative_control_w_o_off_subspace():
    """Test 7: push one W_o off S by 1e-3; tests 2, 3 and 4 must then fail."""
    spec = small()
    basis = spec_basis(spec)
    stages = [build_stage(spec, s, basis) for s in range(spec.n_stages)]
    tok, packer = tokens(spec), WirePacker.for_spec(spec)
    with torch.no_grad():
        base_act = max(activation_in_subspace(h, tok, basis) for h, _ in hidden_states(spec, stages, tok))
        base_rec = reconstruction_error(spec, stages, tok, packer)
    assert base_act < 1e-12 and base_rec < 1e-12
    W = stages[0].blocks[0].wo.weight
    push_off_subspace(W, basis.U, 1e-3)
    assert out_of_subspace(W.detach(), basis.U) == pytest.approx(1e-3, rel=1e-3)
    assert out_of_subspace(W.detach(), basis.U) > 1e-4
    assert max(out_of_subspace(w.detach(), basis.U, rows=r) for _, w, r in stages[0].constrained_weights()) > 1e-4
    with torch.no_grad():
        act = max(activation_in_subspace(h, tok, basis) for h, _ in hidden_states(spec, stages, tok))
        rec = reconstruction_error(spec, stages, tok, packer)
    assert act > 1e-6, act
    assert rec > 1e-6, rec


def test_dense_codec_is_identity():
    spec = small(codec="dense")
    stages = [build_stage(spec, s) for s in range(spec.n_stages)]
    tok = tokens(spec)
    with torch.no_grad():
        for s, (h, z) in enumerate(hidden_states(spec, stages, tok)):
            assert z.shape == (4, spec.seq_len, spec.d_model)
            assert torch.equal(z, h) and torch.equal(stages[s + 1].enter(tok, z), h)


def test_bottleneck_boundary_at_init_is_pad_trunc():
    """Test 12: wire tensors [B, T, b]; with zero-init outputs decode(encode(h)) = pad(trunc(h))."""
    spec = small(codec="bottleneck", rank=6)
    stages = [build_stage(spec, s) for s in range(spec.n_stages)]
    tok = tokens(spec)
    with torch.no_grad():
        for s, (h, z) in enumerate(hidden_states(spec, stages, tok)):
            assert z.shape == (4, spec.seq_len, 6)
            assert torch.equal(z, h[..., :6])
            h_rec = stages[s + 1].enter(tok, z)
            assert torch.equal(h_rec[..., :6], h[..., :6])
            assert torch.equal(h_rec[..., 6:], torch.zeros_like(h[..., 6:]))
    # and the learned part is really there once the output layers are non-zero
    enc, dec = ResBMEncoder(64, 6).double(), ResBMDecoder(64, 6).double()
    x = torch.randn(2, 5, 64, dtype=F64)
    assert not torch.equal(enc(x), x[..., :6])
    assert not torch.equal(dec(x[..., :6])[..., 6:], torch.zeros(2, 5, 58, dtype=F64))


def test_hybrid_boundary_keeps_k_exact_coordinates_and_a_bottleneck_of_the_rest():
    """Issue 24's hybrid: z = [r U, Enc(r_perp)] (w = k + b); the rebuilt h has exactly z_k as its
    span(U) coordinates whatever the trained networks do, and the rest comes from the bottleneck only.
    Its stages are free: nothing is kept in span(U), so a stage writes outside it."""
    spec = small(residual_width=5, basis_updates=False)
    assert spec.boundary_width == spec.rank + 5
    stages = [build_stage(spec, s) for s in range(spec.n_stages)]
    assert all(not m.constrained_parameters() for m in stages)
    tok = tokens(spec)
    with torch.no_grad():
        for m in stages:  # trained networks, not the zero-init identity paths
            for mod in (getattr(m, "encoder", None), getattr(m, "decoder", None)):
                for lin in ([] if mod is None else [mod.enc.down if hasattr(mod, "enc") else mod.dec.down]):
                    lin.weight.normal_(0, 0.05, generator=torch.Generator().manual_seed(3))
        for s, (h, z) in enumerate(hidden_states(spec, stages, tok)):
            U, T = stages[s].encoder.U, stages[s].encoder.T_fixed[tok]
            r = h - T
            assert z.shape == (4, spec.seq_len, spec.rank + 5)
            assert torch.allclose(z[..., :spec.rank], r @ U, rtol=0, atol=1e-12)
            r_perp = r - (r @ U) @ U.T
            assert float(r_perp.norm() / r.norm()) > 0.1  # the free stage wrote outside span(U)
            h_rec = stages[s + 1].enter(tok, z)
            assert torch.allclose((h_rec - T) @ U, z[..., :spec.rank], rtol=0, atol=1e-12)
            moved = z.clone()
            moved[..., spec.rank:] += 1.0  # the bottleneck's numbers move only the part outside span(U)
            h_moved = stages[s + 1].enter(tok, moved)
            assert torch.allclose((h_moved - T) @ U, z[..., :spec.rank], rtol=0, atol=1e-12)
            assert float((h_moved - h_rec).norm()) > 1e-3


@pytest.mark.parametrize("over,word", [(dict(codec="bottleneck", residual_width=4), "subspace codec's hybrid"),
                                       (dict(residual_width=4, basis_updates=True), "basis_updates"),
                                       (dict(residual_width=60, basis_updates=False), "at most d_model"),
                                       (dict(residual_width=4, basis_updates=False, subspace_mode="reparam"),
                                        "free stages"),
                                       (dict(residual_width=-1), "residual_width must be")])
def test_hybrid_options_refused_with_a_reason(over, word):
    with pytest.raises(SpecError, match=word):
        small(**over)


def test_hybrid_default_keeps_the_run_hash():
    spec = small()
    assert "residual_width" not in spec.to_dict()
    assert spec.replace(residual_width=4, basis_updates=False).run_hash != spec.replace(basis_updates=False).run_hash
    assert small(residual_width=4, basis_updates=False).with_codec("dense").residual_width == 0


def test_first_stage_embedding_is_t_fixed_plus_t_s():
    spec = small()
    basis = spec_basis(spec)
    m = build_stage(spec, 0, basis)
    tok = tokens(spec)
    with torch.no_grad():
        e = m.enter(tok, None)
        assert torch.allclose(e, basis.T_fixed[tok] + m.embed.weight[tok], atol=0, rtol=0)
        r = build_stage(small(subspace_mode="reparam"), 0, basis).enter(tok, None)
        # both modes start from the same projected draw: E' U^T = T P
        assert torch.allclose(r, e, atol=1e-15)
