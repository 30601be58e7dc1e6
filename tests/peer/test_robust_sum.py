"""CenteredClip as a detector of far shares (peer/checks/robust_sum.py), on synthetic shares."""
from __future__ import annotations

import torch

from peer.checks.robust_sum import KAPPA, NETWORK_ROWS, lower_median, suspects


def shares(n: int, seed: int = 0, mbs=(4, 4, 4, 4, 4)) -> dict[str, tuple[int, torch.Tensor]]:
    """n honest shares: per microbatch a common direction plus noise of the same size, summed over its microbatches."""
    g = torch.Generator().manual_seed(seed)
    common = torch.randn(1000, generator=g)
    return {f"p{i}": (mbs[i], sum(common + torch.randn(1000, generator=g) for _ in range(mbs[i])))
            for i in range(n)}


def test_honest_shares_are_never_suspects_even_of_unequal_sizes():
    for seed in range(20):
        assert suspects(shares(3, seed)) == []
        assert suspects(shares(5, seed, mbs=(1, 2, 5, 3, 4))) == []


def test_fewer_than_three_working_replicas_name_nobody():
    two = shares(2)
    two["p1"] = (4, two["p1"][1] * -50)
    assert suspects(two) == []
    assert suspects({**two, "idle": (0, torch.zeros(1000))}) == []


def test_far_shares_are_named_in_any_position():
    for victim in ("p0", "p1", "p2"):
        s = shares(3)
        s[victim] = (4, s[victim][1] * -50)
        assert suspects(s) == [victim]
        s[victim] = (4, torch.full((1000,), 1e30))
        assert suspects(s) == [victim]


def test_a_lie_inside_the_honest_spread_is_left_to_the_random_draw():
    s = shares(3)
    s["p1"] = (4, s["p1"][1] * 1.5)  # 50% larger: inside KAPPA times the spread of honest shares
    assert KAPPA > 1.5 and suspects(s) == []


def test_the_min_max_median_is_torchs_bit_for_bit_with_ties_infinities_and_nans():
    """`lower_median` (a min/max network up to NETWORK_ROWS rows) equals torch's median along the rows,
    including ties, signed infinities and NaN columns, for every row count it serves and one beyond."""
    gen = torch.Generator().manual_seed(5)
    for n in range(1, NETWORK_ROWS + 2):
        x = torch.randn(n, 5000, generator=gen)
        x[:, :500] = torch.randint(-2, 3, (n, 500), generator=gen).float()  # ties
        x[0, 600], x[-1, 601] = float("inf"), -float("inf")
        x[n // 2, 700] = float("nan")
        got, want = lower_median(x), x.median(dim=0).values
        assert torch.equal(got.isnan(), want.isnan()) and bool(want[700].isnan()), n
        keep = ~want.isnan()
        assert torch.equal(got[keep], want[keep]), n
