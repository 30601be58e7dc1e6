"""bf16 compute (RunSpec.dtype = "bf16"): fp32 master weights and residual stream, blocks under
bf16 autocast. The subspace boundary stays exact to the wire dtype's precision, and every large
matmul really runs in bf16 (nothing upcast on the way).

Bounds tested, with u the unit roundoff of the wire dtype (fp32 2^-24, bf16 2^-8):
- h - T_fixed[tok] lies in span(U) to 1e-6 (fp32 rounding), in both subspace modes;
- decode(wire(encode(h))) = h to 1e-6 with an fp32 wire and to 2e-3 (about u/2) with a bf16 wire.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from protocol.codecs import WirePacker
from protocol.model import autocast_dtype, build_stage, compute_dtype, lm_loss, spec_basis
from protocol.spec import SpecError, preset
from protocol.subspace import out_of_subspace

MATMULS = ("mm", "addmm", "bmm", "baddbmm")


def small(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=32, n_layers=3, stages=3, batch_size=8,
                microbatch_size=4, rank=8, dtype="bf16", wire_dtype="fp32")
    base.update(kw)
    return preset("tiny", **base)


def tokens(spec, B=4, seed=0):
    return torch.randint(0, spec.vocab, (B, spec.seq_len), generator=torch.Generator().manual_seed(seed))


def test_bf16_keeps_fp32_master_weights():
    spec = small()
    assert compute_dtype(spec) == torch.float32 and autocast_dtype(spec) == torch.bfloat16
    assert autocast_dtype(small(dtype="fp32")) is None and compute_dtype(small(dtype="fp64")) == torch.float64
    m = build_stage(spec, 0)
    assert {p.dtype for p in m.parameters()} == {torch.float32}
    with pytest.raises(SpecError, match="dtype must be one of fp32, fp64, bf16, fp16"):
        small(dtype="int8")  # fp16 is a compute dtype now (with loss scaling); a spec never holds "auto"
    with pytest.raises(SpecError, match="dtype must be one of"):
        small(dtype="auto")


@pytest.mark.parametrize("mode", ["project", "reparam"])
@pytest.mark.parametrize("wire,tol", [("fp32", 1e-6), ("bf16", 2e-3)])
def test_subspace_boundary_is_exact_to_the_wire_precision(mode, wire, tol):
    spec = small(subspace_mode=mode, wire_dtype=wire)
    basis = spec_basis(spec)
    stages = [build_stage(spec, s, basis) for s in range(spec.n_stages)]
    packer, tok, z = WirePacker.for_spec(spec), tokens(spec), None
    with torch.no_grad():
        for s in range(spec.n_stages - 1):
            h = stages[s].body(stages[s].enter(tok, z))
            z = stages[s].leave(h, tok)
            assert h.dtype == z.dtype == torch.float32  # residual stream and boundary in fp32
            moved = h - basis.T_fixed[tok]
            assert float(moved.norm() / h.norm()) > 0.1  # the blocks did write into the stream
            assert out_of_subspace(moved.reshape(-1, spec.d_model), basis.U, rows=True) < 1e-6
            rebuilt = stages[s + 1].enter(tok, packer.roundtrip(z))
            err = float((rebuilt - h).norm() / h.norm())
            assert err < tol, (s, err)
            if wire == "bf16":
                assert err > 1e-5  # the bf16 wire's rounding is what limits it


def test_factored_map_equals_the_full_map_for_a_weight_in_span_u():
    """Under autocast W x is computed as U (U^T W x); for W in span(U) that is the same map."""
    spec = small()
    basis = spec_basis(spec)
    wo = build_stage(spec, 0, basis).blocks[0].wo
    x = torch.randn(4, spec.seq_len, spec.d_model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        fast = wo(x)
    full = x @ wo.weight.detach().T
    assert fast.dtype == torch.float32
    assert float((fast - full).norm() / full.norm()) < 2e-2  # bf16 inputs: a few u
    assert out_of_subspace(fast.reshape(-1, spec.d_model), basis.U, rows=True) < 1e-6


class _DtypeLog(TorchDispatchMode):
    """Records (op, input float dtypes, input shapes) of every aten op that runs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[torch.dtype, ...], tuple[tuple[int, ...], ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ts = [a for a in tree_leaves((args, kwargs or {})) if isinstance(a, torch.Tensor) and a.is_floating_point()]
        self.ops.append((func.overloadpacket.__name__, tuple(t.dtype for t in ts), tuple(tuple(t.shape) for t in ts)))
        return out


@pytest.mark.parametrize("codec", ["subspace", "dense"])
def test_matmuls_and_attention_run_in_bf16(codec):
    """Forward and backward of a middle and the last stage: every matmul takes bf16 inputs, except
    the rank-k ones of the subspace codec and of the factored lifts (kept in fp32 on purpose)."""
    spec = small(codec=codec)
    basis = spec_basis(spec)
    k = spec.rank
    for s in (1, 2):
        m = build_stage(spec, s, basis)
        tok = tokens(spec)
        z = torch.randn(4, spec.seq_len, spec.boundary_width, requires_grad=True)
        with _DtypeLog() as log:
            out = m(tok, z)
            loss = lm_loss(out, tok) if m.is_last else out.pow(2).mean()
            loss.backward()
        matmuls = [(name, dts, shapes) for name, dts, shapes in log.ops if name in MATMULS]
        attention = [dts for name, dts, _ in log.ops if "scaled_dot_product" in name and "backward" not in name]
        assert attention and all(d == (torch.bfloat16,) * 3 for d in attention)
        in_bf16 = Counter(all(d == torch.bfloat16 for d in dts) for _, dts, _ in matmuls)
        assert in_bf16[True] >= 6 * spec.stage_layers[s]  # q, k, v, o, gate, up, down and their grads
        for name, dts, shapes in matmuls:
            if torch.float32 in dts:
                assert codec == "subspace" and any(k in shape for shape in shapes), (name, shapes)
        # nothing is upcast on the way: bf16 meets fp32 only where the residual stream (fp32) takes a
        # block's update, and in attention's backward (its fp32 log-sum-exp)
        mixed = {name for name, dts, _ in log.ops if torch.float32 in dts and torch.bfloat16 in dts}
        assert {name for name in mixed if "scaled_dot_product" not in name} <= {"add"}, mixed
        assert out.dtype == torch.float32 and z.grad.dtype == torch.float32
