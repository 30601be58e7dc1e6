"""The LLaMA-style decoder (RMSNorm pre-norm, RoPE, SwiGLU), cut into pipeline stages.

`build_stage(spec, s)` builds stage s alone, from the spec's seeds, so each peer holds
bit-identical initial weights without seeing the others. With the subspace codec, every
layer that writes into the residual stream of a non-last stage (attention output, MLP down
projection, the trainable embedding T_S) keeps its output side inside span(U), either by
the optimizer ("project", docs/algorithms.md 1.5a) or by construction ("reparam", 1.5c).
The last stage (its blocks, final norm and LM head) is free (1.2 rule 2); so is every stage of the
hybrid (`residual_width` > 0), whose boundary adds a bottleneck of what leaves span(U). With
`embed_split = "per_stage"` every stage also adds its own trainable token table on entry and
takes it off before its encoder, so the boundary stays exact (docs/algorithms.md 1.3).

Compute dtypes (`RunSpec.dtype`): "fp64" and "fp32" run everything in that dtype (the
exactness tests). "bf16" keeps fp32 master weights, fp32 optimizer state, an fp32 residual
stream and fp32 boundary tensors, and runs the blocks and the LM head under
`torch.autocast(dtype=torch.bfloat16)` (matmuls and attention in bf16, norms in fp32). "fp16" is
the same with float16 (cards without bf16), and its stages scale the loss (protocol/loss_scale.py,
peer/runner/stage.py): what the model computes does not change. The
one place autocast is entered is `StageModule.compute`, used by `body` and `logits`; the
codec (`enter`, and `leave` of a non-last stage) stays in fp32, so the boundary's precision
is the wire dtype's. Under autocast a constrained map W = P W is applied as U (U^T W x): the
bf16 matmul makes the k coefficients and the lift into span(U) runs in fp32, so the residual
stream stays in span(U) to fp32 rounding (a bf16 W would leave it by ~2^-9 relative).
"""
from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from protocol.bottleneck import RMSNorm, zero_init_outputs
from protocol.codecs import (
    BottleneckDecoder,
    BottleneckEncoder,
    HybridDecoder,
    HybridEncoder,
    make_decoder,
    make_encoder,
)
from protocol.portable_linalg import portable_matmul
from protocol.spec import COMPUTE_DTYPES, RunSpec
from protocol.subspace import SubspaceBasis, make_basis, portable_project_cols, portable_project_rows


def autocast_dtype(spec: RunSpec) -> torch.dtype | None:
    """The dtype matmuls run in under autocast (bf16 and fp16 runs), or None when they run in `compute_dtype`."""
    dtype = COMPUTE_DTYPES[spec.dtype]
    return dtype if dtype in (torch.bfloat16, torch.float16) else None


def compute_dtype(spec: RunSpec) -> torch.dtype:
    """The dtype tensors are kept in: weights, optimizer state, U and T_fixed, the residual stream and
    the boundary tensors a stage hands to the wire. fp32 in a bf16 or fp16 run (master weights)."""
    return torch.float32 if autocast_dtype(spec) is not None else COMPUTE_DTYPES[spec.dtype]


def spec_basis(spec: RunSpec) -> SubspaceBasis | None:
    """The run's shared U and T_fixed (None unless the codec is subspace)."""
    if spec.codec != "subspace":
        return None
    return make_basis(spec.d_model, spec.rank, spec.vocab, spec.seed, compute_dtype(spec), spec.t_fixed_std)


class SubspaceLinear(nn.Module):
    """A d_in -> d map whose output (column) space stays in span(U).

    "project": a plain weight W [d, d_in] that the subspace AdamW keeps in span(U).
    "reparam": W = U A with trainable A [k, d_in]; any optimizer keeps the invariant.

    `factored` (bf16 runs): y = U (A x) with A = U^T W (or the trainable A), A x under autocast
    and the lift by U in fp32, so y lies in span(U) to fp32 rounding whatever bf16 does to A x.
    For a W in span(U) this is the same function (W = U U^T W) at k/d of the FLOPs.
    """

    def __init__(self, d_in: int, U: torch.Tensor, mode: str, factored: bool = False) -> None:
        super().__init__()
        self.mode, self.factored = mode, factored
        self.register_buffer("U", U.clone(), persistent=False)
        d, k = U.shape
        if mode == "reparam":
            self.A = nn.Parameter(torch.empty(k, d_in, dtype=U.dtype))
        else:
            self.weight = nn.Parameter(torch.empty(d, d_in, dtype=U.dtype))

    def init_from(self, W: torch.Tensor) -> None:
        with torch.no_grad():
            # weights: the same bits on every machine (protocol/portable_linalg.py), as replicas must hold them
            if self.mode == "reparam":
                self.A.copy_(portable_matmul(self.U.T, W, self.A.dtype))
            else:
                self.weight.copy_(portable_project_cols(W, self.U))

    def effective_weight(self) -> torch.Tensor:
        return self.U @ self.A if self.mode == "reparam" else self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.factored:
            return F.linear(x, self.effective_weight())
        device = x.device.type
        with torch.autocast(device, enabled=False):
            A = self.A if self.mode == "reparam" else self.U.T @ self.weight  # [k, d_in], fp32
        c = F.linear(x, A)  # [..., k], in bf16 under autocast
        with torch.autocast(device, enabled=False):
            return c.to(self.U.dtype) @ self.U.T

    def switch_basis(self, U_new: torch.Tensor, reproject: bool = True) -> None:
        """Map the weights into span(U_new): W <- P_new W, or A <- (U_new^T U_old) A."""
        with torch.no_grad():
            if not reproject:
                pass
            elif self.mode == "reparam":
                self.A.copy_(portable_matmul(portable_matmul(U_new.T, self.U.to(U_new)), self.A, self.A.dtype))
            else:
                self.weight.copy_(portable_project_cols(self.weight, U_new))
        self.U = U_new.to(self.U).clone()


def _linear(d_in: int, d_out: int, U: torch.Tensor | None, mode: str, factored: bool) -> nn.Module:
    if U is None:
        return nn.Linear(d_in, d_out, bias=False)
    return SubspaceLinear(d_in, U, mode, factored)


def rope_tables(seq_len: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]
    T = x.shape[-2]
    # in x's dtype: fp32 tables would promote bf16 q and k to fp32 (and attention with them)
    c, s = cos[:T].to(x.dtype), sin[:T].to(x.dtype)
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, spec: RunSpec, U: torch.Tensor | None) -> None:
        super().__init__()
        d, mode = spec.d_model, spec.subspace_mode
        factored = autocast_dtype(spec) is not None
        self.n_heads = spec.n_heads
        self.attn_norm = RMSNorm(d)
        self.wq = nn.Linear(d, d, bias=False)
        self.wk = nn.Linear(d, d, bias=False)
        self.wv = nn.Linear(d, d, bias=False)
        self.wo = _linear(d, d, U, mode, factored)
        self.mlp_norm = RMSNorm(d)
        self.w_gate = nn.Linear(d, spec.d_ff, bias=False)
        self.w_up = nn.Linear(d, spec.d_ff, bias=False)
        self.w_down = _linear(spec.d_ff, d, U, mode, factored)

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, d = h.shape
        x = self.attn_norm(h)
        q, k, v = (w(x).view(B, T, self.n_heads, -1).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + self.wo(a.transpose(1, 2).reshape(B, T, d))
        x = self.mlp_norm(h)
        return h + self.w_down(F.silu(self.w_gate(x)) * self.w_up(x))


class SubspaceEmbedding(nn.Module):
    """E = T_fixed + T_S with the rows of T_S in span(U) (stored as T_S, or as E' with T_S = E' U^T), or
    (mode "free", the hybrid's) with T_S anywhere."""

    def __init__(self, basis: SubspaceBasis, mode: str) -> None:
        super().__init__()
        self.mode = mode
        self.register_buffer("U", basis.U.clone(), persistent=False)
        self.register_buffer("T_fixed", basis.T_fixed.clone(), persistent=False)
        V, d = basis.T_fixed.shape
        shape = (V, basis.rank) if mode == "reparam" else (V, d)
        self.weight = nn.Parameter(torch.empty(shape, dtype=basis.U.dtype))

    def init_from(self, T: torch.Tensor) -> None:
        with torch.no_grad():
            self.weight.copy_(portable_matmul(T, self.U, self.weight.dtype) if self.mode == "reparam"
                              else T if self.mode == "free" else portable_project_rows(T, self.U))

    def trainable_table(self) -> torch.Tensor:
        return self.weight @ self.U.T if self.mode == "reparam" else self.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        if self.mode == "reparam":
            return self.T_fixed[tokens] + self.weight[tokens] @ self.U.T
        return self.T_fixed[tokens] + self.weight[tokens]

    def switch_basis(self, U_new: torch.Tensor, reproject: bool = True) -> None:
        with torch.no_grad():
            if not reproject or self.mode == "free":
                pass
            elif self.mode == "reparam":
                self.weight.copy_(portable_matmul(self.weight, portable_matmul(self.U.T, U_new.to(self.U)),
                                                  self.weight.dtype))
            else:
                self.weight.copy_(portable_project_rows(self.weight, U_new))
        self.U = U_new.to(self.U).clone()


class StageModule(nn.Module):
    """Stage s of the pipeline: (embed | decode boundary) -> blocks -> (encode boundary | norm + LM head).

    `forward(tokens, z_in)` returns the boundary tensor for a non-last stage and the logits
    for the last one. `tokens` are the microbatch's input ids [B, T].
    """

    def __init__(self, spec: RunSpec, stage: int, basis: SubspaceBasis | None = None) -> None:
        super().__init__()
        self.spec, self.stage = spec, stage
        self.checkpointing = False  # activation checkpointing per block (`body`)
        self.is_first, self.is_last = stage == 0, stage == spec.n_stages - 1
        dtype = compute_dtype(spec)
        if spec.codec == "subspace" and basis is None:
            basis = spec_basis(spec)
        self.basis_version = basis.version if basis is not None else 0
        # the hybrid's stages are free: what they write outside span(U) crosses by its bottleneck
        U = basis.U if (basis is not None and not self.is_last and not spec.hybrid) else None
        if self.is_first:
            mode = "free" if spec.hybrid else spec.subspace_mode
            self.embed = SubspaceEmbedding(basis, mode) if spec.codec == "subspace" \
                else nn.Embedding(spec.vocab, spec.d_model)
        else:
            self.decoder = make_decoder(spec, basis)
        # embed_split "per_stage": this stage's own trainable token table, zero at init (docs/fidelity.md)
        self.token_table = nn.Parameter(torch.zeros(spec.vocab, spec.d_model)) \
            if spec.embed_split == "per_stage" else None
        self.blocks = nn.ModuleList(Block(spec, U) for _ in spec.layer_range(stage))
        if self.is_last:
            self.norm = RMSNorm(spec.d_model)
            self.head = nn.Linear(spec.d_model, spec.vocab, bias=False)
        else:
            self.encoder = make_encoder(spec, basis)
        cos, sin = rope_tables(spec.seq_len, spec.head_dim, dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.to(dtype)
        self._init_weights()

    def _init_weights(self) -> None:
        """Seeded per stage, in a fixed order: any process builds the same stage."""
        g = torch.Generator().manual_seed(self.spec.seed * 7919 + 1000 + self.stage)
        std, out_std = 0.02, 0.02 / math.sqrt(2 * self.spec.n_layers)
        dtype = compute_dtype(self.spec)

        def normal(shape: torch.Size, s: float) -> torch.Tensor:
            return (torch.randn(shape, generator=g, dtype=torch.float64) * s).to(dtype)

        for name, mod in self.named_modules():
            if isinstance(mod, SubspaceLinear):
                mod.init_from(normal(torch.Size((mod.U.shape[0], mod.A.shape[1] if mod.mode == "reparam"
                                                 else mod.weight.shape[1])), out_std))
            elif isinstance(mod, SubspaceEmbedding):
                mod.init_from(normal(mod.T_fixed.shape, std))
            elif isinstance(mod, (nn.Linear, nn.Embedding)):
                s = out_std if name.endswith(("wo", "w_down")) else std
                with torch.no_grad():
                    mod.weight.copy_(normal(mod.weight.shape, s))
        for mod in self.modules():
            if isinstance(mod, (BottleneckEncoder, BottleneckDecoder, HybridEncoder, HybridDecoder)):
                zero_init_outputs(getattr(mod, "enc", None), getattr(mod, "dec", None))

    # -------- pieces, so the reference can also run the stages without any boundary
    def enter(self, tokens: torch.Tensor, z_in: torch.Tensor | None) -> torch.Tensor:
        if self.is_first:
            return self.add_table(self.embed(tokens), tokens)
        assert z_in is not None, "a non-first stage needs the boundary tensor"
        return self.add_table(self.decoder(z_in, tokens), tokens)

    def add_table(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """h + D_s[tok] with this stage's own token table D_s (embed_split "per_stage"), else h."""
        return h if self.token_table is None else h + self.token_table[tokens]

    def strip_table(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """h - D_s[tok]: what leaves the stage, so that h - T_fixed[tok] is in span(U) again at the encoder."""
        return h if self.token_table is None else h - self.token_table[tokens]

    def compute(self, device_type: str) -> contextlib.AbstractContextManager:
        """The context the blocks and the LM head run in: autocast in a bf16 or fp16 run, else nothing."""
        dtype = autocast_dtype(self.spec)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=dtype)

    def body(self, h: torch.Tensor) -> torch.Tensor:
        """The blocks; with `checkpointing` (a runtime choice of this process, not part of the run spec)
        each block keeps only its input for backward and runs its forward again there: the same
        operations on the same inputs, so the same numbers, for about one more forward pass."""
        with self.compute(h.device.type):
            for block in self.blocks:
                if self.checkpointing and torch.is_grad_enabled():
                    h = checkpoint(block, h, self.rope_cos, self.rope_sin, use_reentrant=False)
                else:
                    h = block(h, self.rope_cos, self.rope_sin)
        return h

    def compile_blocks(self) -> None:
        """`torch.compile` each block in place: fuses the norms, RoPE, SwiGLU and residual adds
        around the matmuls (a runtime choice of this process, not part of the run spec)."""
        for block in self.blocks:
            block.compile()

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Last stage: final norm and LM head; logits in the compute dtype (the loss is taken in it)."""
        with self.compute(h.device.type):
            out = self.head(self.norm(h))
        return out.to(h.dtype)

    def leave(self, h: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        if self.is_last:
            return self.logits(h)
        return self.encoder(self.strip_table(h, tokens), tokens)

    def forward(self, tokens: torch.Tensor, z_in: torch.Tensor | None = None) -> torch.Tensor:
        return self.leave(self.body(self.enter(tokens, z_in)), tokens)

    # -------- the subspace constraint, for the optimizer and the checks
    def constrained_parameters(self) -> list[tuple[str, nn.Parameter, str]]:
        """(name, parameter, "col" | "row") for every weight the subspace AdamW must keep in span(U)."""
        out = []
        for name, mod in self.named_modules():
            if isinstance(mod, SubspaceLinear) and mod.mode == "project":
                out.append((f"{name}.weight", mod.weight, "col"))
            elif isinstance(mod, SubspaceEmbedding) and mod.mode == "project":
                out.append((f"{name}.weight", mod.weight, "row"))
        return out

    def constrained_weights(self) -> list[tuple[str, torch.Tensor, bool]]:
        """(name, effective weight, rows?) of every constrained map, whatever the mode."""
        out = []
        for name, mod in self.named_modules():
            if isinstance(mod, SubspaceLinear):
                out.append((name, mod.effective_weight(), False))
            elif isinstance(mod, SubspaceEmbedding) and mod.mode != "free":
                out.append((name, mod.trainable_table(), True))
        return out

    def switch_basis(self, basis: SubspaceBasis, reproject: bool = True) -> None:
        """Re-project constrained weights (unless they are known to be in the new span already)
        and re-point every codec at the new basis version."""
        for mod in self.modules():
            if isinstance(mod, (SubspaceLinear, SubspaceEmbedding)):
                mod.switch_basis(basis.U, reproject)
            elif hasattr(mod, "set_basis"):
                mod.set_basis(basis)
        self.basis_version = basis.version


def build_stage(spec: RunSpec, stage: int, basis: SubspaceBasis | None = None) -> StageModule:
    return StageModule(spec, stage, basis)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
