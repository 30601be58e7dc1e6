"""Which replicas' contributions stand far from the rest (issue 21, item 3): CenteredClip
(Karimireddy et al. 2021, the aggregator of "Secure Distributed Training at Scale") used to point
spot checks at a share, never to change the sum.

With three or more replicas that computed microbatches, each contributor i gives the mean of its
share per microbatch, x_i = C_i / n_i. CenteredClip finds a centre robust to a minority of far
points, from v = the coordinate-wise median and tau = median_i ||x_i - v||:

    v <- v + (1/N) sum_i clip_tau(x_i - v),     clip_tau(d) = d min(1, tau / ||d||)      (`ITERS` times)

A contributor is a *suspect* when ||x_i - v|| > KAPPA median_j ||x_j - v||. Every replica of the
stage computes the same suspects from the same contributions and names them in its reduce reply;
the leader then has each suspect's share recomputed whatever its draw (peer/checks/spot_checks.py). The
sum applied stays the exact sum in peer-id order: an honest run equals the one-process run whatever
this says, and a false suspect costs one recomputation, not a ban. What it bounds: a liar whose
share stands KAPPA times farther from the centre than the honest spread is checked at once, in a
step where at least three replicas of its stage computed microbatches; a lie inside that spread,
or in a step with fewer working replicas, waits for the random draw.
"""
from __future__ import annotations

import torch

KAPPA = 5.0
ITERS = 5
NETWORK_ROWS = 8  # up to this many contributors, the median by min/max (`lower_median`); above, torch's sort


def lower_median(x: torch.Tensor) -> torch.Tensor:
    """The coordinate-wise lower median of `x`'s rows, x.median(dim=0).values bit for bit (NaN in, NaN out).

    torch's median along the short axis of an N x P matrix sorts P columns of N (34-50 ms for 3 x 400k on one
    thread, 70 for 7); an odd-even transposition network over the N rows takes N rounds of elementwise min and
    max instead (2-9 ms for 3 rows, 11-17 for 7). A median selects a value, so both give the same bits; a NaN
    meets every row within the N rounds, so its column's median is NaN as torch's is.
    """
    n = x.shape[0]
    if n > NETWORK_ROWS:
        return x.median(dim=0).values
    if n == 1:
        return x[0].clone()
    rows = list(x.unbind(0))
    for r in range(n):
        for i in range(r % 2, n - 1, 2):
            a, b = rows[i], rows[i + 1]
            rows[i], rows[i + 1] = torch.minimum(a, b), torch.maximum(a, b)
    return rows[(n - 1) // 2]  # a new tensor: every row went through a min or a max


def suspects(shares: dict[str, tuple[int, torch.Tensor]]) -> list[str]:
    """The suspects among `shares` (peer -> (microbatches, flat gradient sum)), by peer id."""
    peers = sorted(p for p, (n, _) in shares.items() if n > 0)
    if len(peers) < 3:
        return []
    x = torch.stack([shares[p][1].float() / shares[p][0] for p in peers])
    v = lower_median(x)
    tau = (x - v).norm(dim=1).median()
    for _ in range(ITERS):
        d = x - v
        v = v + (d * (tau / d.norm(dim=1, keepdim=True).clamp_min(1e-30)).clamp(max=1.0)).mean(dim=0)
    dist = (x - v).norm(dim=1)
    if not bool(torch.isfinite(dist).all()):
        return [p for p, r in zip(peers, dist) if not bool(torch.isfinite(r))]
    far = KAPPA * dist.median()
    return [p for p, r in zip(peers, dist) if r > far]
