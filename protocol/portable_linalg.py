"""Linear algebra whose result bits are the same on every machine: what a stage's replicas must agree on.

A float GEMM's bits depend on the order of its sums (thread count, blocking, the device's kernels), so
replicas on unlike CPUs or GPUs that multiply the same numbers can get different bits. An integer GEMM's
do not, when every partial sum is an integer that fp64 holds exactly (|s| <= 2^53): any fp64 GEMM, on
any CPU or GPU, blocked or split any way, then returns the same numbers. Hence

    portable_matmul(X, Y)   X = diag(2^a) sum_p X_p 2^-(p+1)b,   Y = (sum_q Y_q 2^-(q+1)b) diag(2^c)
                            X_p, Y_q integers with |.| <= 2^b, 2b + ceil(log2 k) <= 53 (k: the inner size)
                            X Y ~ diag(2^a) [sum_{p+q<n} (X_p Y_q) 2^-(p+q+2)b] diag(2^c)

(a: each row's exponent of X, c: each column's of Y; n parts, enough for the dtype's mantissa; each
X_p Y_q an exact fp64 GEMM; the terms scaled by powers of two, exactly, and added elementwise in a fixed
order). Elementwise +, -, *, / and sqrt are correctly rounded IEEE operations on every CPU and GPU, so a
fixed sequence of them is portable too; the rest is built from the two:

    portable_orthonormalize(A)   CholeskyQR2: G = A^T A (portable_matmul), G = R^T R (a Cholesky in fixed
                                 order), A <- A R^-1 (R^-1 by back substitution in fixed order), twice.
                                 The result is the Q of A = QR with diag(R) > 0, as `subspace.orthonormalize`
                                 gives it, to the dtype's precision; a column that depends on the ones before
                                 it (pivot below 2^-40 of its norm squared) is replaced by a unit vector
                                 e_j, e_(j+r), ... first, so the result always has r orthonormal columns.

Cost: the Gram and the product each take 3 fp64 GEMMs for fp32 data (2 parts), 6 for fp64; the Cholesky
and the inverse are r small elementwise steps over all matrices at once. Assumes a true fp64 GEMM (no
emulation of fp64 in lower precision, which is off by default in every BLAS torch uses).
"""
from __future__ import annotations

import math

import torch

PIVOT_FLOOR = 2.0 ** -40  # a Cholesky pivot below this x the column's norm squared: the column is dependent
_MANTISSA_BITS = {torch.float64: 53, torch.float32: 24, torch.bfloat16: 8, torch.float16: 11}


def _bits_per_part(inner: int) -> int:
    return (53 - math.ceil(math.log2(max(inner, 2)))) // 2


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e in fp64 from its bits (exact; torch.ldexp goes through a float32 power that over- and underflows)."""
    return ((e.to(torch.int64).clamp(-1022, 1023) + 1023) << 52).view(torch.float64)


def _split(x: torch.Tensor, dim: int, bits: int, n: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """x = 2^e * sum_p part_p 2^-(p+1)bits with integer parts |part_p| <= 2^bits and one e per slice along
    `dim` (the largest |x| of the slice < 2^e). Returns the parts (fp64) and 2^e."""
    x = x.to(torch.float64)
    _, e = torch.frexp(x.abs().amax(dim=dim, keepdim=True))
    e = e.clamp(-1000, 1023)  # a slice below 2^-1000 keeps its bits above fp64's subnormals
    s = x * _pow2(-e)  # |s| < 1
    parts = []
    for _ in range(n):
        s.mul_(2.0 ** bits)  # exact: a power of two
        whole = torch.round(s)
        parts.append(whole)
        s.sub_(whole)  # exact: the bits below the integer's
    return parts, _pow2(e)


def _combine(xs: list[torch.Tensor], x_bits: int, ys: list[torch.Tensor], y_bits: int) -> torch.Tensor:
    """sum_{p+q<n} (X_p @ Y_q) 2^-((p+1) x_bits + (q+1) y_bits): each product an exact integer GEMM, scaled
    exactly, the terms added in a fixed order (the smallest first)."""
    out = None
    for total in reversed(range(len(xs))):
        for p in range(total + 1):
            term = (xs[p] @ ys[total - p]).mul_(2.0 ** -((p + 1) * x_bits + (total - p + 1) * y_bits))
            out = term if out is None else out.add_(term)
    return out


def portable_matmul(X: torch.Tensor, Y: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """X @ Y ([..., n, k] @ [..., k, m], batched as torch.matmul) as the same bits on every device and BLAS,
    in `dtype` (default: the wider of X's and Y's) on X's device, to `dtype`'s precision relative to the
    largest entries of each row of X and each column of Y."""
    dtype = dtype or torch.promote_types(X.dtype, Y.dtype)
    if X.is_meta or Y.is_meta:  # shapes only (a layout sized without weights)
        return (X.to("meta", dtype) @ Y.to("meta", dtype))
    bits = _bits_per_part(X.shape[-1])
    n = math.ceil(_MANTISSA_BITS.get(dtype, 53) / bits)
    xs, ex = _split(X, -1, bits, n)
    ys, ey = _split(Y.to(X.device), -2, bits, n)
    return _combine(xs, bits, ys, bits).mul_(ex).mul_(ey).to(dtype)  # exact: powers of two


def portable_sum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False,
                 dtype: torch.dtype | None = None) -> torch.Tensor:
    """x.sum(dim) (every element when `dim` is None) as the same bits on every device, in `dtype` (default
    x's): the slice's integer parts are summed exactly (every partial sum below 2^53, in any order), then
    combined in a fixed order; exact to `dtype`'s precision relative to the slice's largest entry."""
    dtype = dtype or x.dtype
    if x.is_meta:  # shapes only
        return x.sum(dim, keepdim=keepdim).to(dtype) if dim is not None else x.sum().to(dtype)
    if dim is None:
        x, dim = x.reshape(-1), 0
    dim = dim % x.dim()
    bits = 53 - math.ceil(math.log2(max(x.shape[dim], 2)))
    parts, e = _split(x, dim, bits, math.ceil((_MANTISSA_BITS.get(dtype, 53) + 2) / bits))
    out = None
    for p in reversed(range(len(parts))):  # the smallest first
        term = parts[p].sum(dim, keepdim=True).mul_(2.0 ** (-(p + 1) * bits))
        out = term if out is None else out.add_(term)
    out = out.mul_(e)
    return (out if keepdim else out.squeeze(dim)).to(dtype)


def portable_sqrt(x: torch.Tensor) -> torch.Tensor:
    """sqrt(x), correctly rounded, for fp32 x on any device; torch's own is not (on an H200 0.7% of fp32 roots
    differ from the CPU's in the last bit; torch's CPU root rounds 14-20% of them otherwise, whatever the vector
    unit). Computed in fp64 and
    rounded to fp32: rounding twice is innocuous when the wider format has at least 2p + 2 bits (53 >= 50; the
    root of a 24-bit number lies at least 2^-51 from any fp32 midpoint, relatively), and torch's fp64 root is at
    most one fp64 ulp (2^-52) off (measured here: 1.4% of them are). Other dtypes: torch's own sqrt."""
    return x.double().sqrt().float() if x.dtype == torch.float32 else x.sqrt()


def portable_div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a / b, correctly rounded, for fp32 tensors on any device: computed in fp64 (IEEE's division, correctly
    rounded on CPUs and GPUs) and rounded to fp32, which is innocuous as for `portable_sqrt` (a quotient of
    24-bit numbers lies at least 2^-49 from any fp32 midpoint). Other dtypes: torch's own division."""
    if a.dtype != torch.float32 or b.dtype != torch.float32:
        return a / b
    return (a.double() / b.double()).float()


def _sqrt64(d: torch.Tensor) -> torch.Tensor:
    """Correctly rounded fp64 square roots of a few numbers, by Python's math.sqrt (IEEE's on every platform);
    torch's vectorized sqrt is not always (on an AVX-512 CPU 1.4% of fp64 roots are a bit off)."""
    return torch.tensor([math.sqrt(v) for v in d.tolist()], dtype=torch.float64, device=d.device)


def _cholesky(G: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(R upper with G = R^T R, dependent [K, r]) for G [K, r, r] in fp64, in fixed order; a dependent
    column gets R_jj = 1 and nothing else in its row."""
    A, r = G.clone(), G.shape[-1]
    floor = torch.diagonal(G, dim1=1, dim2=2) * PIVOT_FLOOR
    R = torch.zeros_like(G)
    dependent = torch.zeros(G.shape[:2], dtype=torch.bool, device=G.device)
    for j in range(r):
        d = A[:, j, j]
        ok = d > floor[:, j]  # also False for a zero column and for NaN
        pivot = _sqrt64(torch.where(ok, d, torch.ones_like(d)))
        row = torch.where(ok[:, None], A[:, j, j + 1:] / pivot[:, None], torch.zeros_like(A[:, j, j + 1:]))
        R[:, j, j], R[:, j, j + 1:] = pivot, row
        A[:, j + 1:, j + 1:] = A[:, j + 1:, j + 1:] - row[:, :, None] * row[:, None, :]
        dependent[:, j] = ~ok
    return R, dependent


def _upper_inverse(R: torch.Tensor) -> torch.Tensor:
    """R^-1 for upper-triangular R [K, r, r], back substitution in fixed order."""
    r = R.shape[-1]
    B = torch.eye(r, dtype=R.dtype, device=R.device).expand_as(R).clone()
    inv = torch.zeros_like(R)
    for i in reversed(range(r)):
        inv[:, i, :] = B[:, i, :] / R[:, i, i, None]
        B[:, :i, :] = B[:, :i, :] - R[:, :i, i, None] * inv[:, i, None, :]
    return inv


def _cholesky_qr(As: list[torch.Tensor], precision: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """([A R^-1 for each A], dependent columns [sum K, r]) for a list of A [K, n, r] in fp64, each of its own
    n, with A^T A = R^T R; the r x r steps of all of them at once. A's columns are split once,
    A = A_s diag(2^e), for both products: A^T A = diag(2^e) A_s^T A_s diag(2^e), A R^-1 = A_s (diag(2^e) R^-1)."""
    r = As[0].shape[-1]
    splits, grams = [], []
    for A in As:
        a_bits = _bits_per_part(A.shape[-2])
        parts, e = _split(A, -2, a_bits, math.ceil(precision / a_bits))  # e: [K, 1, r]
        splits.append((parts, e, a_bits))
        grams.append(_combine([p.transpose(1, 2) for p in parts], a_bits, parts, a_bits).mul_(e.transpose(1, 2))
                     .mul_(e))
    R, dependent = _cholesky(torch.cat(grams))
    inverse, out, at = _upper_inverse(R), [], 0
    for parts, e, a_bits in splits:
        y_bits = 53 - math.ceil(math.log2(max(r, 2))) - a_bits
        ys, ey = _split(e.transpose(1, 2) * inverse[at:at + e.shape[0]], -2, y_bits, len(parts))
        out.append(_combine(parts, a_bits, ys, y_bits).mul_(ey))
        at += e.shape[0]
    return out, dependent


def portable_orthonormalize(As: list[torch.Tensor]) -> list[torch.Tensor]:
    """The orthonormal Q (diag(R) > 0) of each [n_i, r] matrix (n_i >= r), all r the same and all on one
    device, as the same bits on every device; each in its own dtype. Matrices of one shape are worked on
    together, and the r x r steps of all of them at once."""
    if not As:
        return []
    if any(a.is_meta for a in As):  # shapes only (a stage sized without weights)
        return [torch.empty_like(a, device="meta") for a in As]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, a in enumerate(As):
        groups.setdefault(tuple(a.shape), []).append(i)
    order = [i for idx in groups.values() for i in idx]
    work = [torch.stack([As[i].to(torch.float64) for i in idx]) for idx in groups.values()]
    # the Gram matrices' precision: more than the data's own, since a Cholesky's errors grow with cond(A)^2
    precision = 53 if any(a.dtype == torch.float64 for a in As) else 42
    for attempt in range(4):  # dependent columns replaced by e_j, e_(j+r), ...: rarely more than once
        Q1, dependent = _cholesky_qr(work, precision)
        if not bool(dependent.any()) or attempt == 3:
            break
        starts = [0]
        for w in work:
            starts.append(starts[-1] + w.shape[0])
        work = [w.clone() for w in work]
        for k, j in dependent.nonzero().tolist():
            g = max(i for i, s0 in enumerate(starts[:-1]) if s0 <= k)
            n, r = work[g].shape[-2:]
            work[g][k - starts[g], :, j] = 0.0
            work[g][k - starts[g], (j + attempt * r) % n, j] = 1.0
    Q2 = torch.cat([q.reshape(-1) for q in _cholesky_qr(Q1, precision)[0]])
    out: list[torch.Tensor | None] = [None] * len(As)
    at = 0
    for i in order:
        out[i] = Q2[at:at + As[i].numel()].view(As[i].shape).to(As[i].dtype)
        at += As[i].numel()
    return out
