"""`NormBand` (peer/daemon/norm_band.py): the band around the median that a stage's incoming boundary
payloads must stay in. Before `warmup` accepted payloads only the absolute cap applies; after, a payload more
than `high` x above or `low` x below the median of the last `window` accepted ones is refused, and a refused one
is never learnt from (a hostile sender cannot drag the band with it)."""
from __future__ import annotations

import math

import torch

from peer.daemon.norm_band import NormBand


def test_after_its_warm_up_the_band_refuses_payloads_far_from_the_median_and_learns_nothing_from_them():
    band = NormBand()  # the daemon's: window 64, warm-up 16, 1e4 up, 1e6 down, absolute 1e4
    assert band.judge(1e-3) is None and band.judge(50.0) is None  # warming up: anything under the cap
    assert band.judge(2e4) is not None  # the cap, from the first message on
    for _ in range(14):
        assert band.judge(0.01) is None
    assert band.accepted == 16  # median of the accepted: 0.01, so the band is [1e-8, 100], under the cap
    above, below = band.judge(100 * 1.01), band.judge(1e-8 / 1.01)
    assert above is not None and "far outside" in above and below is not None and "far outside" in below
    assert band.judge(99.0) is None and band.judge(1.01e-8) is None  # just inside the band: taken
    assert band.accepted == 18  # the two refused were not learnt from
    for _ in range(100):  # a sender pushing just past the band, again and again, moves nothing
        assert band.judge(101.0) is not None
    assert band.accepted == 18 and band.judge(101.0) is not None and band.judge(0.01) is None


def test_the_median_is_of_the_last_window_accepted_so_an_honest_shift_is_followed():
    band = NormBand(window=8, warmup=4, high=100.0, low=100.0, absolute=math.inf)
    for _ in range(8):
        assert band.judge(1.0) is None
    assert band.judge(500.0) is not None  # 500 x the median: refused
    for r in (50.0, 90.0, 99.0, 99.0, 99.0, 99.0, 99.0, 99.0):  # honest payloads that grow within the band
        assert band.judge(r) is None
    assert band.judge(500.0) is None  # the median moved to 99: 500 is within 100x now
    assert band.judge(0.5) is not None  # and 0.5, fine at the start, is now below it


def test_check_judges_the_rms_over_the_scale_and_refuses_non_finite_values():
    band = NormBand(warmup=0)
    t = torch.full((16,), 3.0)
    assert NormBand.rms(t) == 3.0 and NormBand.rms(torch.empty(0)) == 0.0
    assert band.check(t * 1e6, scale=1e6) is None  # an fp16 gradient carrying a loss scale of 1e6: rms 3e6 / 1e6
    assert band.check(t * 1e6) is not None  # the same without its scale: over the cap
    assert band.check(torch.tensor([float("nan"), 1.0])) is not None
    assert band.check(torch.tensor([float("inf")])) is not None
    assert band.check(torch.tensor([3e38])) is not None  # finite, but its square overflows
