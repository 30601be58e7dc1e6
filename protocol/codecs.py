"""Boundary codecs: how a stage's output becomes a few numbers per token, and back.

One interface, three codecs (and the subspace codec's hybrid). The sending stage owns a `BoundaryEncoder`
(activation h [B,T,d] -> boundary tensor z [B,T,w]); the receiving stage owns a
`BoundaryDecoder` (z -> h). Both are differentiable modules, so the backward gradient
that travels is dL/dz, of the same small width w as the forward payload:

- dense:      w = d, identity both ways.
- subspace:   z = (h - T_fixed[tok]) U (w = k); h = z U^T + T_fixed[tok]. Exact when
              h - T_fixed[tok] lies in span(U), and then dL/dz = g U is the exact
              projected gradient (docs/algorithms.md 1.3-1.4).
- bottleneck: z = Enc(h) + h[..., :b]; h = Dec(z) + pad(z) (docs/algorithms.md 2), lossy, trained.
- hybrid (subspace with `residual_width` b > 0): with r = h - T_fixed[tok] and r_perp = r - U U^T r,
              z = [r U, Enc(r_perp)] (w = k + b); h = T_fixed[tok] + U z_k + (I - U U^T) Dec(z_b).
              The k coordinates are exact (U^T of the rebuilt h is z_k), the b are a trained, lossy
              summary of what the stage wrote outside span(U): its stages are free.

Under any codec a `WirePacker` turns z (or dL/dz) into wire tensors: fp32, bf16 or fp64,
optionally int8 with one absmax scale per token stacked under it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from protocol.bottleneck import ResBMDecoder, ResBMEncoder
from protocol.spec import WIRE_DTYPES, RunSpec
from protocol.subspace import SubspaceBasis, project_rows


class BoundaryEncoder(nn.Module):
    width: int

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class BoundaryDecoder(nn.Module):
    width: int

    def forward(self, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class DenseEncoder(BoundaryEncoder):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.width = d

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return h


class DenseDecoder(BoundaryDecoder):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.width = d

    def forward(self, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return z


class _BasisHolder(nn.Module):
    """Holds U and T_fixed as non-persistent buffers: they come from seeds, never from checkpoints."""

    def __init__(self, basis: SubspaceBasis) -> None:
        super().__init__()
        self.register_buffer("U", basis.U.clone(), persistent=False)
        self.register_buffer("T_fixed", basis.T_fixed.clone(), persistent=False)
        self.width = basis.rank
        self.version = basis.version

    def set_basis(self, basis: SubspaceBasis) -> None:
        self.U = basis.U.to(self.U)
        self.version = basis.version


class SubspaceEncoder(_BasisHolder, BoundaryEncoder):
    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return (h - self.T_fixed[tokens]) @ self.U


class SubspaceDecoder(_BasisHolder, BoundaryDecoder):
    def forward(self, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return z @ self.U.T + self.T_fixed[tokens]


class BottleneckEncoder(BoundaryEncoder):
    def __init__(self, d: int, b: int) -> None:
        super().__init__()
        self.width = b
        self.enc = ResBMEncoder(d, b)

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.enc(h)


class BottleneckDecoder(BoundaryDecoder):
    def __init__(self, d: int, b: int) -> None:
        super().__init__()
        self.width = b
        self.dec = ResBMDecoder(d, b)

    def forward(self, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.dec(z)


class HybridEncoder(_BasisHolder, BoundaryEncoder):
    def __init__(self, basis: SubspaceBasis, b: int) -> None:
        super().__init__(basis)
        self.width = basis.rank + b
        self.enc = ResBMEncoder(basis.U.shape[0], b)

    def forward(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        r = h - self.T_fixed[tokens]
        c = r @ self.U
        return torch.cat([c, self.enc(r - c @ self.U.T)], dim=-1)


class HybridDecoder(_BasisHolder, BoundaryDecoder):
    def __init__(self, basis: SubspaceBasis, b: int) -> None:
        super().__init__(basis)
        self.width = basis.rank + b
        self.dec = ResBMDecoder(basis.U.shape[0], b)

    def forward(self, z: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        k = self.U.shape[1]
        e = self.dec(z[..., k:])
        return self.T_fixed[tokens] + z[..., :k] @ self.U.T + (e - project_rows(e, self.U))


def make_encoder(spec: RunSpec, basis: SubspaceBasis | None) -> BoundaryEncoder:
    if spec.hybrid:
        assert basis is not None, "the hybrid codec needs a basis"
        return HybridEncoder(basis, spec.residual_width)
    if spec.codec == "subspace":
        assert basis is not None, "the subspace codec needs a basis"
        return SubspaceEncoder(basis)
    if spec.codec == "bottleneck":
        return BottleneckEncoder(spec.d_model, spec.rank)
    return DenseEncoder(spec.d_model)


def make_decoder(spec: RunSpec, basis: SubspaceBasis | None) -> BoundaryDecoder:
    if spec.hybrid:
        assert basis is not None, "the hybrid codec needs a basis"
        return HybridDecoder(basis, spec.residual_width)
    if spec.codec == "subspace":
        assert basis is not None, "the subspace codec needs a basis"
        return SubspaceDecoder(basis)
    if spec.codec == "bottleneck":
        return BottleneckDecoder(spec.d_model, spec.rank)
    return DenseDecoder(spec.d_model)


# ---------------------------------------------------------------- bytes side

@dataclass
class WireTensors:
    """What a boundary tensor becomes on the wire: values, plus per-token scales for int8."""

    values: torch.Tensor
    scale: torch.Tensor | None = None


class WirePacker:
    """Casts (and optionally int8-quantizes) boundary tensors for the wire, and back.

    Projection and encoding run in the compute dtype; only the result is cast (docs/algorithms.md 1.3).
    int8 uses a symmetric absmax scale per token (last axis), the scale in the wire dtype.
    """

    def __init__(self, wire_dtype: str, quant: str = "none") -> None:
        self.dtype = WIRE_DTYPES[wire_dtype]
        self.quant = quant

    @classmethod
    def for_spec(cls, spec: RunSpec) -> WirePacker:
        return cls(spec.wire_dtype, spec.quant)

    @property
    def value_dtype(self) -> torch.dtype:
        return torch.int8 if self.quant == "int8" else self.dtype

    def bytes_per_number(self) -> int:
        return torch.tensor([], dtype=self.value_dtype).element_size()

    def pack(self, z: torch.Tensor) -> WireTensors:
        z = z.detach()
        if self.quant == "int8":
            scale = z.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30) / 127.0
            scale = scale.to(self.dtype)
            q = torch.round(z / scale.to(z.dtype)).clamp_(-127, 127).to(torch.int8)
            return WireTensors(q, scale)
        return WireTensors(z.to(self.dtype))

    def unpack(self, w: WireTensors, like: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
        """Wire tensors -> one tensor of dtype `like` on `device`. The wire bytes go to the device
        first and are widened there: a bf16 payload crosses the host link at half an fp32's size
        and the cast runs on the accelerator."""
        values = w.values.to(device)
        if self.quant == "int8":
            assert w.scale is not None, "int8 wire tensors carry a scale"
            return values.to(like) * w.scale.to(device).to(like)
        return values.to(like)

    def roundtrip(self, z: torch.Tensor) -> torch.Tensor:
        """pack then unpack, in place of a real transfer (the one-process reference uses this)."""
        return self.unpack(self.pack(z), like=z.dtype, device=z.device)


class WireRoundtrip(torch.autograd.Function):
    """Applies the wire's precision loss to the activation forward and the gradient backward."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, packer: WirePacker) -> torch.Tensor:  # type: ignore[override]
        ctx.packer = packer
        return packer.roundtrip(z)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        return ctx.packer.roundtrip(g), None
