"""The shared basis and the Grassmann step (docs/algorithms.md 1.6, 1.7; section 3 tests 1, 9, 10)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from protocol.subspace import (
    SubspaceBasis,
    grassmann_step,
    make_basis,
    orthonormalize,
    out_of_subspace,
    principal_angles,
    project_cols,
    project_rows,
)

REPO = Path(__file__).resolve().parents[2]
F64 = torch.float64


def gram_error(U: torch.Tensor) -> float:
    return float((U.T @ U - torch.eye(U.shape[1], dtype=U.dtype)).abs().max())


def random_psd(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    A = torch.randn(d, d, generator=g, dtype=F64)
    return A @ A.T / d


# ---------------------------------------------------------------- the basis itself

@pytest.mark.parametrize("d,k,V", [(64, 8, 256), (128, 1, 300), (32, 32, 10)])
def test_basis_orthonormal_fp64(d, k, V):
    b = make_basis(d, k, V, seed=3, dtype=F64)
    assert b.U.shape == (d, k) and b.T_fixed.shape == (V, d)
    assert b.U.dtype == F64 and b.T_fixed.dtype == F64
    assert gram_error(b.U) < 1e-12
    assert b.rank == k and b.version == 0


def test_basis_orthonormal_fp32():
    b = make_basis(256, 16, 256, seed=0, dtype=torch.float32)
    assert b.U.dtype == torch.float32
    assert gram_error(b.U) < 1e-6


def test_t_fixed_is_high_rank_and_scaled():
    b = make_basis(64, 8, 256, seed=1, dtype=F64)
    assert int(torch.linalg.matrix_rank(b.T_fixed)) == 64
    assert 0.018 < float(b.T_fixed.std()) < 0.022  # T_FIXED_STD = 0.02


def test_basis_deterministic_and_seeded():
    a = make_basis(64, 8, 256, seed=5, dtype=F64)
    b = make_basis(64, 8, 256, seed=5, dtype=F64)
    c = make_basis(64, 8, 256, seed=6, dtype=F64)
    assert torch.equal(a.U, b.U) and torch.equal(a.T_fixed, b.T_fixed)
    assert a.hash() == b.hash()
    assert a.hash() != c.hash()
    assert len(a.hash()) == 16 and int(a.hash(), 16) >= 0
    # fp32 and fp64 copies of the same constants hash alike (the hash is over fp32 bytes) ...
    assert make_basis(64, 8, 256, seed=5, dtype=torch.float32).hash() == a.hash()
    # ... and any change of one number changes it
    T = a.T_fixed.clone()
    T[17, 3] += 1e-3
    assert SubspaceBasis(a.U, T).hash() != a.hash()


@pytest.mark.e2e
def test_basis_hash_equal_across_processes():
    """docs/algorithms.md section 3 test 9: a fresh interpreter regenerates the same constants from the seed."""
    code = ("import torch; from protocol.subspace import make_basis; "
            "print(make_basis(64, 8, 256, 11, torch.float64).hash(), "
            "make_basis(64, 8, 256, 12, torch.float32).hash())")
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=180, check=True)
    here = [make_basis(64, 8, 256, 11, F64).hash(), make_basis(64, 8, 256, 12, torch.float32).hash()]
    assert out.stdout.split() == here
    assert here[0] != here[1]


# ---------------------------------------------------------------- projections and angles

def test_projections():
    U = make_basis(32, 4, 8, seed=0, dtype=F64).U
    g = torch.Generator().manual_seed(1)
    W = torch.randn(32, 20, generator=g, dtype=F64)
    PW = project_cols(W, U)
    assert torch.allclose(project_cols(PW, U), PW, atol=1e-14)  # idempotent
    assert out_of_subspace(PW, U) < 1e-14
    assert out_of_subspace(W, U) > 0.5  # a random matrix is mostly outside a 4-dim subspace
    T = torch.randn(20, 32, generator=g, dtype=F64)
    assert out_of_subspace(project_rows(T, U), U, rows=True) < 1e-14
    assert out_of_subspace(T, U, rows=True) > 0.5
    # the relative out-of-subspace norm of a known mix: W = P X + eps (I-P) Y
    X, Y = torch.randn(32, 5, generator=g, dtype=F64), torch.randn(32, 5, generator=g, dtype=F64)
    inside, outside = project_cols(X, U), Y - project_cols(Y, U)
    outside = outside / outside.norm() * 1e-3 * inside.norm()
    assert out_of_subspace(inside + outside, U) == pytest.approx(1e-3 / math.sqrt(1 + 1e-6), rel=1e-9)


def test_principal_angles_known_rotation():
    d, theta = 16, 0.0123
    E = torch.eye(d, dtype=F64)
    U1 = E[:, :3]
    U2 = U1.clone()
    U2[:, 1] = math.cos(theta) * E[:, 1] + math.sin(theta) * E[:, 7]
    ang = principal_angles(U1, U2)
    assert ang.shape == (3,)
    assert float(ang.max()) == pytest.approx(theta, rel=1e-12)
    assert float(ang[:2].abs().max()) < 1e-15
    assert float(principal_angles(U1, U1).max()) == 0.0


def test_orthonormalize_unique_basis_of_span():
    g = torch.Generator().manual_seed(2)
    A = torch.randn(20, 5, generator=g, dtype=F64)
    R = torch.triu(torch.rand(5, 5, generator=g, dtype=F64)) + torch.eye(5, dtype=F64)  # positive diagonal
    Q1, Q2 = orthonormalize(A), orthonormalize(A @ R)
    assert gram_error(Q1) < 1e-13
    assert torch.allclose(Q1, Q2, atol=1e-12)  # same span, sign-fixed QR: same basis
    _, Rq = torch.linalg.qr(A)
    assert torch.allclose(Q1.T @ A, torch.diag(torch.sign(torch.diagonal(Rq))) @ Rq, atol=1e-12)
    assert bool((torch.diagonal(Q1.T @ A) > 0).all())


# ---------------------------------------------------------------- Grassmann step

@pytest.mark.parametrize("cap", [0.05, 0.01])
def test_grassmann_step_orthonormal_capped_ascent(cap):
    d, k = 48, 6
    U = make_basis(d, k, 4, seed=4, dtype=F64).U
    C = random_psd(d, seed=9)
    obj = lambda V: float(torch.trace(V.T @ C @ V))  # noqa: E731
    values = [obj(U)]
    for _ in range(10):
        U_new = grassmann_step(U, C @ U, eta=1.0, max_angle=cap)
        assert gram_error(U_new) < 1e-12
        angle = float(principal_angles(U, U_new).max())
        assert 0 < angle <= cap + 1e-12
        values.append(obj(U_new))
        U = U_new
    assert all(b > a for a, b in zip(values, values[1:])), values
    # ascent converges towards the top-k eigenvalue sum, never above it
    top = float(torch.linalg.eigvalsh(C)[-k:].sum())
    assert values[-1] <= top + 1e-9
    assert values[-1] > values[0]


def test_grassmann_step_small_eta_not_shrunk():
    U = make_basis(32, 4, 4, seed=1, dtype=F64).U
    C = random_psd(32, seed=2)
    U_new = grassmann_step(U, C @ U, eta=1e-3, max_angle=0.05)
    # a step of length t along D with ||D||_F = 1: the principal angles are ~ t times the
    # singular values of D, so their root sum of squares is ~ t (no bisection happened)
    ang = principal_angles(U, U_new)
    assert float(ang.norm()) == pytest.approx(1e-3, rel=1e-3)


def test_grassmann_step_zero_gradient_returns_U():
    d, k = 32, 4
    g = torch.Generator().manual_seed(3)
    Q = orthonormalize(torch.randn(d, d, generator=g, dtype=F64))
    lam = torch.linspace(1, 2, d, dtype=F64)
    C = Q @ torch.diag(lam) @ Q.T
    U = Q[:, :k]  # an invariant subspace of C: D = (I - UU^T) C U = 0
    out = grassmann_step(U, C @ U, eta=0.1)
    assert torch.equal(out, U) and out is not U
    assert torch.equal(grassmann_step(U, torch.zeros(d, k, dtype=F64), eta=0.1), U)
    # and a non-invariant subspace does move
    V = orthonormalize(U + 0.1 * Q[:, k:2 * k])
    assert float(principal_angles(V, grassmann_step(V, C @ V, eta=0.1)).max()) > 1e-3
