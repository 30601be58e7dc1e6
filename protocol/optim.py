"""The subspace-preserving AdamW (docs/algorithms.md 1.5a) and the learning-rate schedule.

A step that applies a sum other replicas apply too (`portable`) is made of operations whose bits
do not depend on the machine (elementwise IEEE operations one at a time, correctly rounded sqrt
and division, `protocol/portable_linalg.py`'s products and sums): a stage's replicas on unlike
CPUs and GPUs then hold the same bits (docs/algorithms.md 5.3).

For a weight W [d, n] whose columns must stay in span(U) the optimizer consumes only the
projected gradient P G and shares the adaptive rate along each input column, so every
update is (something in span(U)) times a diagonal on the right and W never leaves the
subspace. For T_S [V, d] (rows in span(U)) it uses G P and one rate per row. Everything
else gets plain decoupled AdamW. In "reparam" mode there is nothing to constrain and this is
plain AdamW.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from protocol.portable_linalg import portable_div, portable_sqrt, portable_sum
from protocol.spec import RunSpec
from protocol.subspace import portable_project_cols, portable_project_rows, project_cols, project_rows


class SubspaceAdamW(torch.optim.Optimizer):
    """AdamW with per-group `constraint` in {None, "col", "row"} and a shared basis U."""

    def __init__(self, groups: list[dict], U: torch.Tensor | None, lr: float, betas: tuple[float, float],
                 eps: float, weight_decay: float, v_scale: float = 1.0) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, constraint=None)
        super().__init__(groups, defaults)
        self.U = U
        self.v_scale = v_scale

    def set_basis(self, U: torch.Tensor) -> None:
        """Map first moments into span(U_new); second moments are kept (they are per column/row
        scalars, which a rotation of the subspace does not invalidate to first order)."""
        for group in self.param_groups:
            kind = group["constraint"]
            for p in group["params"]:
                st = self.state.get(p)
                if not st or kind is None:
                    continue
                m = st["exp_avg"]
                m.copy_(portable_project_cols(m, U) if kind == "col" else portable_project_rows(m, U))
        self.U = U

    @torch.no_grad()
    def step(self, closure=None, in_span: bool = False, portable: bool = False):  # type: ignore[override]
        """`in_span`: the constrained gradients are in span(U) already (rebuilt from subspace coordinates,
        `SyncLayout.unpack`): they are not projected again. `portable`: a sum other replicas apply too, so
        every operation gives the same bits on any machine (docs/algorithms.md 5.3); else torch's own,
        faster fused operations (a lone replica, the one-process model)."""
        for group in self.param_groups:
            b1, b2 = group["betas"]
            lr, eps, wd, kind = group["lr"], group["eps"], group["weight_decay"], group["constraint"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    if kind == "col":
                        st["exp_avg_sq"] = torch.zeros(1, p.shape[1], dtype=p.dtype, device=p.device)
                    elif kind == "row":
                        st["exp_avg_sq"] = torch.zeros(p.shape[0], 1, dtype=p.dtype, device=p.device)
                    else:
                        st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                c1, c2 = 1 - b1 ** st["step"], 1 - b2 ** st["step"]
                update = _portable_update if portable else _fused_update
                update(p, p.grad, st["exp_avg"], st["exp_avg_sq"], kind, None if in_span else self.U,
                       (b1, b2, c1, c2, lr, eps, wd, self.v_scale))
        return None


def _fused_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, kind: str | None,
                  U: torch.Tensor | None, h: tuple[float, ...]) -> None:
    """One parameter's AdamW step with torch's own (fused, machine-dependent) operations. `U`: project g on it."""
    b1, b2, c1, c2, lr, eps, wd, v_scale = h
    if kind == "col":
        g = g if U is None else project_cols(g, U)
        sq = g.pow(2).mean(dim=0, keepdim=True) * v_scale
    elif kind == "row":
        g = g if U is None else project_rows(g, U)
        sq = g.pow(2).mean(dim=1, keepdim=True) * v_scale
    else:
        sq = g * g
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).add_(sq, alpha=1 - b2)
    denom = (v / c2).sqrt_().add_(eps)
    if wd:
        p.mul_(1 - lr * wd)
    p.addcdiv_(m, denom, value=-lr / c1)


def _portable_update(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, kind: str | None,
                     U: torch.Tensor | None, h: tuple[float, ...]) -> None:
    """The same step, its bits the same on any machine: one rounding per operation, none fused (a fused
    a + b c rounds once, and which kernels fuse differs between CPUs and GPUs); no division by a number (a
    GPU divides a tensor by a scalar as a product with its reciprocal, a CPU divides: both multiply alike);
    sqrt and division correctly rounded (torch's are not, on the CPU or on the GPU); products and sums
    `protocol/portable_linalg.py`'s."""
    b1, b2, c1, c2, lr, eps, wd, v_scale = h
    if kind == "col":
        g = g if U is None else portable_project_cols(g, U)
        sq = portable_sum(g * g, dim=0, keepdim=True) * (v_scale / g.shape[0])
    elif kind == "row":
        g = g if U is None else portable_project_rows(g, U)
        sq = portable_sum(g * g, dim=1, keepdim=True) * (v_scale / g.shape[1])
    else:
        sq = g * g
    m.mul_(b1).add_(g * (1 - b1))
    v.mul_(b2).add_(sq * (1 - b2))
    denom = portable_sqrt(v * (1 / c2)).add_(eps)
    if wd:
        p.mul_(1 - lr * wd)
    p.add_(portable_div(m, denom) * (-lr / c1))


def make_optimizer(spec: RunSpec, module: nn.Module) -> SubspaceAdamW:
    """Groups: constrained (col/row), decayed matrices, undecayed vectors (norm gains). A group's
    `lr_scale` (`set_lr`) is `constrained_stage_lr_scale` on a stage before the last (any codec),
    times `constrained_lr_scale` for the constrained groups; 1 elsewhere. With a ramp
    (`constrained_stage_lr_end`) a stage before the last marks its groups `stage_ramp`: `set_lr` scales them
    by `stage_lr_ratio` too."""
    constrained = getattr(module, "constrained_parameters", lambda: [])()
    special = {id(p) for _, p, _ in constrained}
    decay, no_decay = [], []
    for p in module.parameters():
        if id(p) in special or not p.requires_grad:
            continue
        (decay if p.ndim >= 2 else no_decay).append(p)
    early = not getattr(module, "is_last", True)
    stage_scale = spec.constrained_stage_lr_scale if early else 1.0
    groups = [dict(params=decay), dict(params=no_decay, weight_decay=0.0)]
    for kind in ("col", "row"):
        ps = [p for _, p, k in constrained if k == kind]
        if ps:
            groups.append(dict(params=ps, constraint=kind, lr_scale=stage_scale * spec.constrained_lr_scale))
    for g in groups[:2]:
        g["lr_scale"] = stage_scale
    for g in groups:  # a default run's optimizer state stays as it was (no key that every group has at 1)
        if g["lr_scale"] == 1.0:
            del g["lr_scale"]
        if early and spec.constrained_stage_lr_end:
            g["stage_ramp"] = True
    U = None
    for mod in module.modules():
        if hasattr(mod, "U") and isinstance(mod.U, torch.Tensor):
            U = mod.U
            break
    v_scale = spec.d_model / spec.rank if (spec.codec == "subspace" and spec.v_scale_by_rank) else 1.0
    groups = [g for g in groups if g["params"]]
    return SubspaceAdamW(groups, U, spec.lr, spec.betas, spec.eps, spec.weight_decay, v_scale)


def lr_at(spec: RunSpec, step: int) -> float:
    """Linear warmup over warmup_steps, then cosine to min_lr_ratio*lr at total_steps (or constant)."""
    if spec.warmup_steps and step < spec.warmup_steps:
        return spec.lr * (step + 1) / spec.warmup_steps
    if spec.total_steps <= spec.warmup_steps:
        return spec.lr
    frac = min(1.0, (step - spec.warmup_steps) / max(1, spec.total_steps - spec.warmup_steps))
    return spec.lr * (spec.min_lr_ratio + (1 - spec.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def stage_lr_ratio(spec: RunSpec, step: int) -> float:
    """The stage lr's ramp at `step`, relative to `constrained_stage_lr_scale` (s0): with an end s1 > 0,
    s(step) = s0 + (s1 - s0) * clip((step - warmup_steps) / (total_steps - warmup_steps), 0, 1), and the ratio is
    s(step) / s0 (1 through the warm-up); without one, 1."""
    s0, s1 = spec.constrained_stage_lr_scale, spec.constrained_stage_lr_end
    if not s1:
        return 1.0
    frac = min(1.0, max(0.0, (step - spec.warmup_steps) / (spec.total_steps - spec.warmup_steps)))
    return (s0 + (s1 - s0) * frac) / s0


def set_lr(optimizer: torch.optim.Optimizer, lr: float, stage_ratio: float = 1.0) -> None:
    """Every group's lr = lr x its `lr_scale` (1 where it has none: `make_optimizer`), x `stage_ratio` for the
    groups of a stage before the last under a ramp (`stage_ramp`)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0) * (stage_ratio if group.get("stage_ramp") else 1.0)


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, project=None, portable: bool = False) -> float:
    """Clip by the global norm of the gradients the optimizer will consume.

    `project(p, g)` maps a raw gradient to its projected form for constrained weights, so the
    norm (and the clip) is the same whether or not the out-of-subspace part is present.
    `portable`: the norm's sums the same bits on any machine (`SubspaceAdamW.step`'s `portable`).
    """
    grads = [(p, p.grad) for p in params if p.grad is not None]
    if not grads:
        return 0.0
    # summed on the device in float64, one term after the other (what a Python sum of floats did),
    # and read back once: one host sync per step instead of one per parameter
    sq = torch.zeros((), dtype=torch.float64, device=grads[0][1].device)
    for p, g in grads:
        g = project(p, g) if project else g
        if portable:
            g = g.to(torch.float64)
            sq += portable_sum(g * g).to(sq.device)
        else:
            sq += g.pow(2).sum().to(device=sq.device, dtype=torch.float64)
    total = math.sqrt(float(sq))
    if max_norm > 0 and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for _, g in grads:
            g.mul_(scale)
    return total
