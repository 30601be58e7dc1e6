"""`NormBand`: bounded trust in the numbers other peers send.

A boundary activation or gradient from an honest peer has a root-mean-square that moves,
but not by orders of magnitude at once. The band learns it from the messages it accepted and
refuses any payload whose RMS leaves [m / low, m * high], m the median of the last `window`
accepted RMS values, and always any RMS above `absolute` (finite but enormous values, like
3e38, whose squares overflow the gradient norm and make a stage's weights non-finite; below
that, gradient clipping bounds what a large value can do). The band is wide on purpose
(1e4 up, 1e6 down): a basis switch moved honest gradients by ~300x in one step in our tests,
and banning an honest peer stalls a swarm. A refused payload is never learnt from, so a
hostile sender cannot drag the band with it.

A boundary gradient of an fp16 run carries the run's loss scale S (protocol/loss_scale.py): the
band judges its RMS / S, the true gradient's, so the scale growing or halving moves nothing here,
and an overflow never reaches the band (it travels as a flag, with zeros: peer/runner/loss_scaling.py).

What it cannot catch: a sender that stays inside the band but sends wrong numbers (see
docs/security.md).
"""
from __future__ import annotations

import math
import statistics
from collections import deque

import torch


class NormBand:
    def __init__(self, window: int = 64, warmup: int = 16, high: float = 1e4, low: float = 1e6,
                 absolute: float = 1e4) -> None:
        self.window, self.warmup, self.high, self.low, self.absolute = window, warmup, high, low, absolute
        self._seen: deque[float] = deque(maxlen=window)
        self.accepted = 0

    @staticmethod
    def rms(t: torch.Tensor) -> float:
        return float(t.detach().double().pow(2).mean().sqrt()) if t.numel() else 0.0

    def check(self, t: torch.Tensor, scale: float = 1.0) -> str | None:
        """Why `t` is refused, or None (and then it is learnt from); `t` is judged as t / scale."""
        return self.judge(self.rms(t) / scale)

    def judge(self, r: float) -> str | None:
        """`check` of a payload whose RMS (over the scale) is `r`, worked out beforehand."""
        if not math.isfinite(r) or r > self.absolute:
            return f"its values are out of range (rms {r:.3g})."
        if self.accepted >= self.warmup and self._seen:  # a band of warm-up 0 has no median before its first
            m = statistics.median(self._seen)
            if r > m * self.high or r < m / self.low:
                return f"its size (rms {r:.3g}) is far outside what this stage has been receiving (~{m:.3g})."
        self._seen.append(r)
        self.accepted += 1
        return None
