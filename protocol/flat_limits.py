"""`FlatLimits`: what a stage accepts as a flat gradient (a replica's contribution to a reduce, control.py;
a reduced gradient forwarded to a replica catching up, state_wire.py), and the checks of those tensors."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from protocol.spec import in_stat_window
from protocol.wire import need


@dataclass(frozen=True)
class FlatLimits:
    """What a stage accepts as a flat gradient: its own `SyncLayout` size and compute dtype, and
    per exchange phase the size of the exact part and of the factors (`phases`)."""

    run: str
    stage: int
    numel: int  # a whole gradient in the stage's SyncLayout (follow updates; "exact" contributions)
    dtype: torch.dtype
    stat_shape: tuple[int, int] | None  # (d, k) for receiving subspace stages
    n_microbatches: int
    phases: tuple[tuple[int, int], ...] = ()  # (exact numbers, factor numbers) per phase; () = exact sync
    factor_dtype: torch.dtype | None = None
    full_numel: int = 0  # every parameter's gradient in full (a lone replica's follow updates)
    exact_until: int = 0  # steps before this one sum exactly, whatever `phases` says (powersgd's warm-up)
    stat_steps: tuple[int, int] = (1, 1)  # (basis_interval, stat_window): the steps whose contributions carry a stat

    def at(self, step: int) -> FlatLimits:
        """The limits of a contribution to step `step`: exact sync during the warm-up, and no statistic outside
        the window before a re-fit (`RunSpec.stat_window`)."""
        lim = dataclasses.replace(self, phases=()) if step < self.exact_until else self
        if lim.stat_shape is not None and not in_stat_window(step, *lim.stat_steps):
            lim = dataclasses.replace(lim, stat_shape=None)
        return lim

    @property
    def exchange(self) -> tuple[tuple[int, int], ...]:
        return self.phases or ((self.numel, 0),)

    @property
    def max_bytes(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        felem = torch.tensor([], dtype=self.factor_dtype).element_size() if self.factor_dtype else 0
        stat = 8 * math.prod(self.stat_shape) if self.stat_shape else 0
        biggest = max([self.numel * elem, self.full_numel * elem] + [n * elem + f * felem for n, f in self.exchange])
        return biggest + stat + 64 * self.n_microbatches + 4096


def flat_tensor(t: object, lim: FlatLimits, what: str, numel: int | None = None,
                dtype: torch.dtype | None = None) -> torch.Tensor:
    """`t`, a finite flat tensor of `numel` numbers (the stage's whole gradient unless given) in `dtype`
    (the compute dtype unless given)."""
    numel, dtype = lim.numel if numel is None else numel, dtype or lim.dtype
    need(isinstance(t, torch.Tensor) and t.dtype == dtype and t.ndim == 1 and t.numel() == numel,
         f"{what} must be a flat {dtype} tensor of {numel} numbers.")
    need(bool(torch.isfinite(t).all()), f"{what} has NaN or infinite values.")
    return t


def stat_tensor(t: object, lim: FlatLimits) -> torch.Tensor | None:
    """The re-fit statistic `t`: a finite float64 tensor of the stage's statistic shape, or None where the
    stage sends none at this step (`FlatLimits.at`)."""
    if lim.stat_shape is None:
        need(t is None, "this stage sends no re-fit statistic at this step.")
        return None
    need(isinstance(t, torch.Tensor) and t.dtype == torch.float64 and tuple(t.shape) == lim.stat_shape,
         f"the statistic must be a float64 tensor of shape {list(lim.stat_shape)}.")
    need(bool(torch.isfinite(t).all()), "the statistic has NaN or infinite values.")
    return t
