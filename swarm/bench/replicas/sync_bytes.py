"""Bytes one replica sends per step to keep its stage in step, per replica-sync mode (exact figures).

For each stage of a preset, the `Contribution` messages one replica sends to each other
replica in one step, encoded by `protocol/control.py` and framed as the transport frames them
(request + empty acknowledgement), for:

    exact, full       every trainable parameter's gradient in full (replicas before the
                      subspace layout: the baseline of docs/algorithms.md 5.1)
    exact             the stage's `SyncLayout` (constrained gradients in subspace coordinates)
    powersgd          round 1 (exact part + P factors) and round 2 (Q factors), rank r, factors
                      in the run's wire dtype

The stage is built on the meta device (no memory for weights), so `large` costs nothing to
measure. A message's size is its encoding with tensors of the true sizes; past 64 KiB of
tensor bytes msgpack's framing no longer depends on the size, so the size of a large message
is that of a 64 KiB one plus the missing bytes (`encoded_size`, checked against the real
encoding in tests/swarm/test_bench_replica_sync.py).
"""
from __future__ import annotations

import torch

from protocol.control import Contribution, encode_contribution
from protocol.model import StageModule, compute_dtype, spec_basis
from protocol.powersgd import PowerPlan
from protocol.spec import WIRE_DTYPES, RunSpec
from protocol.sync_layout import SyncLayout
from swarm.net import REPLY_OVERHEAD, REQUEST_OVERHEAD

FRAMING = REQUEST_OVERHEAD + REPLY_OVERHEAD  # a request and its empty acknowledgement
_DIRECT = 1 << 16  # tensors up to this many bytes are encoded as they are


def _elem(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


def encoded_size(spec: RunSpec, stage: int, mbs: list[int], exact: tuple[int, torch.dtype] | None,
                 factors: tuple[int, torch.dtype] | None, stat: bool, phase: int = 0) -> int:
    """Bytes of one encoded `Contribution` whose tensors have these (numel, dtype), without
    allocating big tensors: each tensor over 64 KiB is encoded at 64 KiB and the rest added."""
    extra = 0

    def tensor(spec_: tuple[int, torch.dtype] | None) -> torch.Tensor | None:
        nonlocal extra
        if spec_ is None:
            return None
        n, dtype = spec_
        cap = max(1, _DIRECT // _elem(dtype))
        if n > cap:
            extra += (n - cap) * _elem(dtype)
            n = cap
        return torch.zeros(n, dtype=dtype)

    st = torch.zeros(spec.d_model, spec.rank, dtype=torch.float64) if stat else None
    c = Contribution(spec.run_hash, 0, 0, stage, mbs, tensor(exact), st, phase, tensor(factors))
    return len(encode_contribution(c)) + extra


def stage_layout(spec: RunSpec, stage: int) -> tuple[SyncLayout, int]:
    """(the stage's SyncLayout, its trainable parameter count), from a module on the meta device."""
    basis = spec_basis(spec)
    with torch.device("meta"):
        module = StageModule(spec, stage, basis)
    n_params = sum(p.numel() for p in module.parameters() if p.requires_grad)
    return SyncLayout.for_module(module, spec.rank if basis is not None else None), n_params


def sync_bytes(spec: RunSpec, rank: int, replicas: int = 2) -> list[dict]:
    """Per stage and mode: bytes one replica sends per step (to its replicas - 1 partners)."""
    dtype, factor_dtype = compute_dtype(spec), WIRE_DTYPES[spec.wire_dtype]
    mbs = list(range(spec.n_microbatches // replicas or 1))  # its share of the step's microbatches
    rows = []
    for s in range(spec.n_stages):
        layout, n_params = stage_layout(spec, s)
        stat = spec.codec == "subspace" and spec.basis_updates and s > 0
        plan = PowerPlan.for_layout(layout, rank)
        per_peer = {
            "exact, full": encoded_size(spec, s, mbs, (n_params, dtype), None, stat) + FRAMING,
            "exact": encoded_size(spec, s, mbs, (layout.numel, dtype), None, stat) + FRAMING,
            "powersgd": encoded_size(spec, s, mbs, (plan.exact_numel, dtype), (plan.p_numel, factor_dtype), stat)
            + encoded_size(spec, s, [], None, (plan.q_numel, factor_dtype), False, phase=1) + 2 * FRAMING,
        }
        for mode, b in per_peer.items():
            rows.append({"preset": spec.name, "stage": s, "params": n_params, "mode": mode,
                         "rank": rank if mode == "powersgd" else None,
                         "bytes_per_step": b * (replicas - 1)})
    return rows
