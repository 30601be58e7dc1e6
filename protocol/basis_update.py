"""Basis updates on the wire: the statistic a stage sends, and the new U the coordinator signs.

`StatsMessage`: a receiving stage's EMA of C_s U (d x k) at a re-fit step, sent to the
coordinator. `BasisUpdate`: (run, version, effective step, U) plus the coordinator's
signature over `signing_bytes()`. Signing and key checks belong to the swarm; this room
defines the bytes, validates their shape and values, and computes the next basis from the
stages' statistics (the same pure function in the coordinator and in the oracle).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import msgpack
import torch

from protocol.portable_linalg import portable_orthonormalize
from protocol.spec import RunSpec
from protocol.subspace import grassmann_step
from protocol.wire import WireError, ext_hook, pack_tensor

BASIS_DOMAIN = "subspace-swarm/basis-update/v1"


@dataclass
class StatsMessage:
    run: str
    stage: int
    basis_version: int
    step: int  # the re-fit step (a multiple of basis_interval)
    M: torch.Tensor  # [d, k] float32


@dataclass
class BasisUpdate:
    run: str
    version: int
    effective_step: int
    U: torch.Tensor  # [d, k] float32, orthonormal
    signature: bytes = b""

    def signing_bytes(self) -> bytes:
        digest = hashlib.sha256(self.U.detach().to(torch.float32).contiguous().numpy().tobytes()).hexdigest()
        return msgpack.packb([BASIS_DOMAIN, self.run, self.version, self.effective_step, digest])


def _limits_check(t: object, spec: RunSpec, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (spec.d_model, spec.rank):
        raise WireError(f"{what} must be a float32 tensor of shape [{spec.d_model}, {spec.rank}].")
    if not bool(torch.isfinite(t).all()):
        raise WireError(f"{what} has NaN or infinite values.")
    return t


def _unpack(data: bytes, spec: RunSpec, kind: str) -> dict:
    limit = spec.d_model * spec.rank * 4 + 4096
    if len(data) > limit:
        raise WireError(f"{kind} message of {len(data)} bytes is over the limit of {limit}.")
    try:
        d = msgpack.unpackb(bytes(data), ext_hook=ext_hook, raw=False, max_array_len=16, max_map_len=16)
    except WireError:
        raise
    except Exception as e:
        raise WireError(f"{kind} message is not valid msgpack ({type(e).__name__}).") from None
    if not isinstance(d, dict) or not isinstance(d.get("k"), str) or d.get("k") != kind:
        raise WireError(f"not a {kind} message.")
    if not isinstance(d.get("r"), str) or d.get("r") != spec.run_hash:
        raise WireError(f"{kind} message is for another run.")
    for key in ("v", "s"):
        if not isinstance(d.get(key), int) or isinstance(d.get(key), bool) or not 0 <= d[key] < 2**53:
            raise WireError(f"{kind} message field {key!r} must be a non-negative integer.")
    return d


def encode_stats(m: StatsMessage) -> bytes:
    return msgpack.packb({"k": "stats", "r": m.run, "g": m.stage, "v": m.basis_version, "s": m.step,
                          "M": pack_tensor(m.M.detach().to("cpu", torch.float32))})


def decode_stats(data: bytes, spec: RunSpec) -> StatsMessage:
    d = _unpack(data, spec, "stats")
    if not isinstance(d.get("g"), int) or isinstance(d["g"], bool) or not 1 <= d["g"] < spec.n_stages:
        raise WireError(f"stats come from receiving stages 1..{spec.n_stages - 1} only.")
    return StatsMessage(d["r"], d["g"], d["v"], d["s"], _limits_check(d.get("M"), spec, "the statistic"))


def encode_update(u: BasisUpdate) -> bytes:
    return msgpack.packb({"k": "basis", "r": u.run, "v": u.version, "s": u.effective_step,
                          "U": pack_tensor(u.U.detach().to("cpu", torch.float32)), "sig": u.signature})


def decode_update(data: bytes, spec: RunSpec) -> BasisUpdate:
    """Shape, values and orthonormality; the signature is checked by the caller, who holds the key."""
    d = _unpack(data, spec, "basis")
    U = _limits_check(d.get("U"), spec, "the basis")
    err = float((U.T.double() @ U.double() - torch.eye(spec.rank, dtype=torch.float64)).abs().max())
    if err > 1e-4:
        raise WireError(f"the basis is not orthonormal (|U^T U - I| = {err:.1e}).")
    if not isinstance(d.get("sig"), bytes) or len(d["sig"]) > 512:
        raise WireError("the basis update carries no valid signature field.")
    return BasisUpdate(d["r"], d["v"], d["s"], U, d["sig"])


def next_basis(U: torch.Tensor, stats: list[torch.Tensor], spec: RunSpec) -> torch.Tensor:
    """Combine the stages' statistics (summed in stage order) and take one capped Grassmann step."""
    M = torch.stack([s.to("cpu", torch.float64) for s in stats]).sum(0)
    U = U.to("cpu", torch.float64)
    return grassmann_step(U, M, spec.grassmann_eta, spec.grassmann_max_angle).to(torch.float32)


def canonical_basis(U: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The basis a stage actually uses for a received U: re-orthonormalized in float64 by the portable QR (the
    same bits on every peer's machine, docs/algorithms.md 5.3), then cast. The coordinator steps from this same
    tensor, so its next update starts where the stages are."""
    (Q,) = portable_orthonormalize([U.detach().to("cpu", torch.float64)])
    return Q.to(dtype)
