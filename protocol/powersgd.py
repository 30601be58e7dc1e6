"""PowerSGD with error feedback, summed over a stage's replicas (docs/algorithms.md 5.2).

Pure math; the exchange of the two rounds is `peer/commit/commit.py`'s. For each matrix M_i of
replica i (its gradient sum in travelling coordinates, `protocol/sync_layout.py`, plus its
own error e_i from earlier steps), with Q [m, r] shared by every replica:

    round 1   P_i = M_i Q                  sent; P = sum_i P_i;  P^ = orthonormalize(P)
    round 2   Q_i = M_i^T P^               sent; Q' = sum_i Q_i
    result    G^ = P^ Q'^T  (= P^ P^^T sum_i M_i, the sum projected on span(P^))
    error     e_i <- M_i - P^ Q_i^T        (kept by replica i: sum_i e_i = sum_i M_i - G^)
    next Q    orthonormalize(Q')           (the warm start of the next step's power iteration)

Factors travel in the run's wire dtype; each replica rounds its own factors as it sends them
and uses the rounded ones (in the sums and in its error), so the rounding is fed back like
the rest of the error. Sums run in ascending peer-id order on the CPU, and `orthonormalize` and
the product P^ Q'^T are `protocol/portable_linalg.py`'s, whose bits do not depend on the CPU,
GPU, BLAS or thread count: every replica gets the same P^, Q' and G^ bit for bit on any machine,
and replicas stay identical. Vectors (norm gains) and matrices too small to gain from factors
travel exactly, and are simply summed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protocol.portable_linalg import portable_matmul, portable_orthonormalize
from protocol.sync_layout import SyncLayout


@dataclass(frozen=True)
class PowerPlan:
    """Which layout entries travel as rank-r factors (`compressed`) and which as they are (`exact`)."""

    rank: int
    compressed: tuple[int, ...]
    exact: tuple[int, ...]
    exact_numel: int
    p_numel: int  # sum of n * r over compressed [n, m] entries
    q_numel: int  # sum of m * r

    @classmethod
    def for_layout(cls, layout: SyncLayout, rank: int) -> PowerPlan:
        compressed, exact = [], []
        for i, e in enumerate(layout.entries):
            n, m = (e.shape if len(e.shape) == 2 else (0, 0))
            # factors only where they are fewer numbers than the matrix itself
            (compressed if len(e.shape) == 2 and rank < min(n, m) and rank * (n + m) < n * m else exact).append(i)
        ents = layout.entries
        return cls(rank, tuple(compressed), tuple(exact), sum(ents[i].numel for i in exact),
                   sum(ents[i].shape[0] * rank for i in compressed), sum(ents[i].shape[1] * rank for i in compressed))

    def numbers_sent(self) -> int:
        """Numbers one replica sends per peer per step: the exact part and both factors."""
        return self.exact_numel + self.p_numel + self.q_numel


@dataclass
class PowerState:
    """One replica's side: Q of every compressed matrix (equal on every replica that took the
    last step together) and its own error feedback."""

    Q: list[torch.Tensor]  # [m, r] per compressed entry
    error: list[torch.Tensor]  # [n, m] per compressed entry

    @classmethod
    def initial(cls, layout: SyncLayout, plan: PowerPlan, seed: int, dtype: torch.dtype,
                device: torch.device | str = "cpu") -> PowerState:
        """Seeded Q (the same on every replica of the stage), zero error."""
        g = torch.Generator().manual_seed(seed)
        shapes = [layout.entries[i].shape for i in plan.compressed]
        Q = portable_orthonormalize([torch.randn(m, plan.rank, generator=g, dtype=torch.float64) for _, m in shapes])
        return cls([q.to(device, dtype) for q in Q], [torch.zeros(n, m, dtype=dtype, device=device) for n, m in shapes])

    def change_basis(self, layout: SyncLayout, plan: PowerPlan, R: torch.Tensor) -> None:
        """The basis moved from U_old to U_new (R = U_new^T U_old, k x k): map what is in subspace
        coordinates. A "col" entry is U^T G (its error's rows are coordinates); a "row" entry is G U
        (its error's columns and its Q's rows are)."""
        for j, i in enumerate(plan.compressed):
            kind = layout.entries[i].kind
            if kind == "col":
                self.error[j] = R.to(self.error[j]) @ self.error[j]
            elif kind == "row":
                self.error[j] = self.error[j] @ R.to(self.error[j]).T
                self.Q[j] = portable_matmul(R.to(self.Q[j]), self.Q[j])  # Q is the replicas' common state


@dataclass
class FirstRound:
    """What replica i computed for round 1: its matrices with error added, its exact part and its P_i."""

    M: list[torch.Tensor]
    exact: torch.Tensor  # flat, compute dtype, CPU
    P: torch.Tensor  # flat, factor dtype, CPU
    zero: bool = False  # nothing to add (no gradient and no error): the replica may send nothing


def first_round(layout: SyncLayout, plan: PowerPlan, state: PowerState, flat: torch.Tensor,
                factor_dtype: torch.dtype) -> FirstRound:
    """M_i = G_i + e_i and P_i = M_i Q (rounded to the factor dtype) from a flat gradient in layout coordinates."""
    views = layout.views(flat)
    M = [views[i] + state.error[j] for j, i in enumerate(plan.compressed)]
    P = [(m @ q).to(factor_dtype) for m, q in zip(M, state.Q)]
    exact = torch.cat([views[i].reshape(-1) for i in plan.exact]) if plan.exact else flat.new_zeros(0)
    return FirstRound(M, exact.cpu(), _cat(P, factor_dtype).cpu())


def orthonormal_factors(layout: SyncLayout, plan: PowerPlan, P_sum: torch.Tensor,
                        dtype: torch.dtype) -> list[torch.Tensor]:
    """P^ per compressed entry: the summed P (flat, CPU) orthonormalized, in the compute dtype."""
    out, off = [], 0
    for i in plan.compressed:
        n = layout.entries[i].shape[0]
        out.append(P_sum[off:off + n * plan.rank].view(n, plan.rank).to(dtype))
        off += n * plan.rank
    return portable_orthonormalize(out)


def second_round(M: list[torch.Tensor], P_hat: list[torch.Tensor], factor_dtype: torch.dtype) -> list[torch.Tensor]:
    """Q_i = M_i^T P^ per entry, rounded to the factor dtype (what is sent, and what the error uses)."""
    return [(m.T @ p.to(m)).to(factor_dtype) for m, p in zip(M, P_hat)]


def cat_factors(factors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return _cat(factors, dtype).cpu()


def finish(layout: SyncLayout, plan: PowerPlan, first: FirstRound, exact_sum: torch.Tensor,
           P_hat: list[torch.Tensor], Q_mine: list[torch.Tensor], Q_sum: torch.Tensor,
           dtype: torch.dtype) -> tuple[torch.Tensor, PowerState]:
    """(G^ as a flat vector in layout coordinates, on the device of M; this replica's next state).
    It stays there: a large stage's G^ copied to the host and back cost seconds a step on a GPU."""
    device = first.M[0].device if first.M else exact_sum.device
    flat, q_next, P_hat = rebuild(layout, plan, exact_sum, P_hat, Q_sum, dtype, device)
    error = [first.M[j] - P_hat[j] @ Q_mine[j].to(dtype).T for j in range(len(plan.compressed))]
    return flat, PowerState(q_next, error)


def rebuild(layout: SyncLayout, plan: PowerPlan, exact_sum: torch.Tensor, P_hat: list[torch.Tensor],
            Q_sum: torch.Tensor, dtype: torch.dtype, device: torch.device | str
            ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """(G^ flat on `device`, the next Q, P^ on `device`) from the sums alone: what every replica of
    the reduce computes, and what a replica catching up computes from the sums its donor forwards
    (peer/commit/follow_forward.py), the same operations on the same numbers, portable ones where a float GEMM
    would depend on the machine. Q' and its orthonormalization are worked out on the CPU and reach the device
    in one copy with the exact part: a copy per matrix waited for the device each time."""
    flat = torch.empty(layout.numel, dtype=dtype, device=device)
    views = layout.views(flat)
    qs, off = [], 0
    for i in plan.compressed:
        m = layout.entries[i].shape[1]
        qs.append(Q_sum[off:off + m * plan.rank].view(m, plan.rank).to(dtype))
        off += m * plan.rank
    q_next = portable_orthonormalize(qs)
    exact, *moved = on_device([exact_sum, *qs, *q_next, *P_hat], device)
    n = len(qs)
    qs, q_next, P_hat = moved[:n], moved[n:2 * n], moved[2 * n:]
    off = 0
    for i in plan.exact:
        k = layout.entries[i].numel
        views[i].copy_(exact[off:off + k].view(layout.entries[i].shape))
        off += k
    for j, i in enumerate(plan.compressed):
        views[i].copy_(portable_matmul(P_hat[j], qs[j].T))
    return flat, q_next, P_hat


def on_device(tensors: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """`tensors` on `device`, values and dtypes unchanged: those elsewhere moved in one copy per dtype
    (views of it), those already there as they are."""
    device = torch.device(device)
    out = [t if t.device == device else None for t in tensors]
    away = [i for i, t in enumerate(out) if t is None]
    for dt in dict.fromkeys(tensors[i].dtype for i in away):
        idx = [i for i in away if tensors[i].dtype == dt]
        whole = torch.cat([tensors[i].reshape(-1) for i in idx]).to(device)
        off = 0
        for i in idx:
            out[i] = whole[off:off + tensors[i].numel()].view(tensors[i].shape)
            off += tensors[i].numel()
    return out


def _cat(tensors: list[torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.zeros(0, dtype=dtype)
