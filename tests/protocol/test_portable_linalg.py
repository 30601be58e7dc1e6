"""portable_linalg: products and orthonormal bases whose bits do not depend on the machine."""
from __future__ import annotations

import hashlib
import math

import pytest
import torch

from protocol.portable_linalg import (
    _bits_per_part,
    _combine,
    _split,
    portable_div,
    portable_matmul,
    portable_orthonormalize,
    portable_sqrt,
)
from protocol.subspace import orthonormalize


def _bits(ts: list[torch.Tensor] | torch.Tensor) -> str:
    ts = ts if isinstance(ts, list) else [ts]
    return hashlib.sha256(b"".join(t.detach().cpu().contiguous().numpy().tobytes() for t in ts)).hexdigest()


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _graded(n: int, r: int, seed: int, spread: float = 4.0) -> torch.Tensor:
    """[n, r] with column norms over `spread` decades and a little correlation: a P from a power iteration."""
    g = torch.Generator().manual_seed(seed)
    scales = torch.logspace(0, -spread, r, dtype=torch.float64)
    A = torch.randn(n, r, generator=g, dtype=torch.float64) * scales
    return A + 0.3 * A[:, :1]


def test_the_product_is_the_matmul_to_the_dtypes_precision():
    g = torch.Generator().manual_seed(0)
    X, Y = torch.randn(700, 8, generator=g, dtype=torch.float64), torch.randn(8, 300, generator=g, dtype=torch.float64)
    want = X @ Y
    assert float((portable_matmul(X, Y) - want).abs().max()) < 1e-13
    # fp32: no further from the true product than the float32 GEMM itself
    got32, gemm32 = portable_matmul(X.float(), Y.float()), X.float() @ Y.float()
    assert got32.dtype == torch.float32
    assert float((got32.double() - want).abs().max()) <= 2 * float((gemm32.double() - want).abs().max())
    # batched as torch.matmul
    Xb = torch.randn(3, 50, 8, generator=g, dtype=torch.float64)
    Yb = torch.randn(3, 8, 40, generator=g, dtype=torch.float64)
    assert float((portable_matmul(Xb, Yb) - Xb @ Yb).abs().max()) < 1e-13


def test_every_partial_sum_is_an_exact_integer_so_any_order_of_summing_gives_the_same_bits():
    """The integer GEMMs equal int64 GEMMs exactly: no rounding anywhere, whatever the BLAS does."""
    g = torch.Generator().manual_seed(1)
    X, Y = torch.randn(64, 1376, generator=g), torch.randn(1376, 8, generator=g)
    bits = _bits_per_part(1376)
    xs, _ = _split(X, -1, bits, 2)
    ys, _ = _split(Y, -2, bits, 2)
    for x in xs:
        for y in ys:
            assert x.abs().max() <= 2 ** bits and y.abs().max() <= 2 ** bits
            assert torch.equal((x @ y).to(torch.int64), x.to(torch.int64) @ y.to(torch.int64))
    # and the terms are combined elementwise, so a row's bits do not depend on the other rows
    perm = torch.randperm(64, generator=g)
    assert torch.equal(portable_matmul(X, Y)[perm], portable_matmul(X[perm], Y))
    assert _combine(xs, bits, ys, bits).shape == (64, 8)


def test_the_same_bits_with_any_thread_count(threads):
    X, Y = _graded(2048, 32, 2).float(), _graded(2048, 32, 3).float().T.contiguous()
    Ps = [_graded(512, 32, 4).float(), _graded(1376, 32, 5).float(), _graded(512, 32, 6).float()]
    seen = set()
    for n in (1, 2, 3):
        torch.set_num_threads(n)
        seen.add((_bits(portable_matmul(X, Y)), _bits(portable_orthonormalize(Ps))))
    assert len(seen) == 1


def test_the_basis_is_qr_with_a_positive_diagonal():
    # against LAPACK, itself only cond(A) x eps exact (cond ~1e4 here): 1e-10 in fp64; orthonormality is ours alone
    for dtype, tol, ortho in ((torch.float64, 1e-10, 1e-12), (torch.float32, 1e-6, 1e-6)):
        A = _graded(1376, 8, 7).to(dtype)
        (Q,) = portable_orthonormalize([A])
        assert Q.dtype == dtype and Q.shape == A.shape
        # against LAPACK's QR of the same numbers (A as rounded to the dtype) in fp64
        assert float((Q.double() - orthonormalize(A.to(dtype).double())).abs().max()) < tol
        eye = torch.eye(8, dtype=torch.float64)
        assert float((Q.double().T @ Q.double() - eye).abs().max()) < ortho


def test_matrices_are_worked_on_together_without_changing_their_bits():
    As = [_graded(512, 8, 8), _graded(32, 8, 9), _graded(512, 8, 10), _graded(1376, 8, 11)]
    together = portable_orthonormalize(As)
    assert all(torch.equal(t, portable_orthonormalize([a])[0]) for t, a in zip(together, As))


def test_dependent_and_zero_columns_still_give_r_orthonormal_columns_spanning_the_rest():
    A = _graded(300, 6, 12, spread=1.0)
    A[:, 2] = 0.0  # nothing there (a replica with no gradient in a direction)
    A[:, 4] = 2.0 * A[:, 1] - A[:, 0]  # depends on earlier columns
    (Q,) = portable_orthonormalize([A])
    assert float((Q.T @ Q - torch.eye(6, dtype=torch.float64)).abs().max()) < 1e-12
    assert float((Q @ (Q.T @ A) - A).abs().max()) < 1e-12  # span(Q) holds every column of A
    Z = torch.zeros(50, 4, dtype=torch.float64)  # all zero: still an orthonormal basis (as QR gives one)
    (Qz,) = portable_orthonormalize([Z])
    assert float((Qz.T @ Qz - torch.eye(4, dtype=torch.float64)).abs().max()) < 1e-12


def _brackets(r: torch.Tensor, inside) -> bool:
    """Each fp32 r is the correctly rounded result: the true one lies between r's midpoints with its neighbours,
    `inside(lo, hi)` deciding it exactly in fp64."""
    up, down = torch.nextafter(r, torch.full_like(r, math.inf)), torch.nextafter(r, torch.full_like(r, -math.inf))
    r64 = r.double()
    return bool(inside((r64 + down.double()) * 0.5, (r64 + up.double()) * 0.5).all())


def test_sqrt_and_division_are_correctly_rounded():
    g = torch.Generator().manual_seed(17)
    for lo, hi in ((1e-12, 1e-6), (0.5, 2.0), (1e-40, 1e-36)):  # small second moments, ordinary, subnormal
        x = torch.rand(200_000, generator=g) * (hi - lo) + lo
        x64 = x.double()
        assert _brackets(portable_sqrt(x), lambda m0, m1, x64=x64: (m0 * m0 <= x64) & (x64 <= m1 * m1))
    a, b = torch.randn(200_000, generator=g), torch.rand(200_000, generator=g) * 1e-3 + 1e-8
    a64, b64 = a.double(), b.double()  # b > 0: a / b grows with a
    assert _brackets(portable_div(a, b), lambda m0, m1: (m0 * b64 <= a64) & (a64 <= m1 * b64))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="comparing devices needs a GPU")
def test_a_gpu_gets_the_cpus_bits():
    torch.backends.cuda.matmul.allow_tf32 = False
    X, Y = _graded(2048, 8, 13).float(), _graded(1376, 8, 14).float().T.contiguous()
    Ps = [_graded(512, 8, 15).float(), _graded(1376, 8, 16).float()]
    assert _bits(portable_matmul(X, Y)) == _bits(portable_matmul(X.cuda(), Y.cuda()))
    # (orth runs on the CPU in a swarm, where P and Q' are summed; on a GPU its r x r steps are the same
    # operations, and its square roots Python's)
    assert _bits(portable_orthonormalize(Ps)) == _bits(portable_orthonormalize([p.cuda() for p in Ps]))
    x, y = _graded(4096, 8, 17).float().abs(), _graded(4096, 8, 18).float().abs() + 1e-8
    on_gpu = [portable_sqrt(x.cuda()), portable_div(x.cuda(), y.cuda())]
    assert _bits([portable_sqrt(x), portable_div(x, y)]) == _bits(on_gpu)
