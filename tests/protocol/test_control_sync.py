"""Replica-sync messages on the way in (protocol/control.py): contributions of both replica_sync
modes and both powersgd phases round-trip, and anything of the wrong phase, size, dtype or
shape is refused with a WireError; follow updates say which layout they are in, and a powersgd
step follows as the reduce's sums, checked against the stage's phases like a contribution; a probe of a
replica's reduce comes through the same decoder and is told from a contribution."""
from __future__ import annotations

import dataclasses

import msgpack
import pytest
import torch

from protocol.control import (
    BadContribution,
    Contribution,
    FlatLimits,
    ReduceProbe,
    decode_contribution,
    decode_probe_reply,
    decode_reduce,
    encode_contribution,
    encode_probe,
    encode_probe_reply,
)
from protocol.state_wire import FollowUpdate, decode_follow, encode_follow
from protocol.wire import WireError

RUN = "0123456789abcdef"
EXACT = FlatLimits(RUN, 1, 100, torch.float32, (8, 2), 4, full_numel=300)
POWER = FlatLimits(RUN, 1, 100, torch.float32, (8, 2), 4, ((10, 40), (0, 30)), torch.bfloat16, 300)
STAT = torch.zeros(8, 2, dtype=torch.float64)


def c(phase=0, mbs=(0, 1), grads=10, factors=40, stat=True, fdtype=torch.bfloat16) -> bytes:
    return encode_contribution(Contribution(
        RUN, 3, 1, 1, list(mbs), None if grads is None else torch.ones(grads), STAT if stat else None, phase,
        None if factors is None else torch.ones(factors, dtype=fdtype)))


def test_powersgd_contributions_of_both_phases_round_trip():
    first = decode_contribution(c(), POWER)
    assert (first.phase, first.microbatches, first.grads.numel(), first.factors.numel()) == (0, [0, 1], 10, 40)
    assert first.factors.dtype == torch.bfloat16 and first.stat is not None
    second = decode_contribution(c(1, (), None, 30, False), POWER)
    assert (second.phase, second.microbatches, second.grads, second.factors.numel()) == (1, [], None, 30)
    # a replica without microbatches sends nothing: no microbatch, no factors (issue 21), so error
    # feedback cannot carry a gradient that no microbatch of the step accounts for
    for grads, factors in ((10, 40), (10, None), (None, 40)):
        with pytest.raises(BadContribution, match="without microbatches carries no tensors"):
            decode_reduce(c(0, (), grads, factors, False), POWER)
    empty = decode_contribution(c(0, (), None, None, False), POWER)
    assert empty.grads is None and empty.factors is None
    assert decode_contribution(c(1, (), None, None, False), POWER).factors is None


@pytest.mark.parametrize("body,why", [
    (c(2), "phase"),
    (c(0, factors=30), "factors"),
    (c(0, grads=11), "exact part"),
    (c(0, fdtype=torch.float32), "factors"),
    (c(0, factors=None), "factors"),
    (c(1, (0,), None, 30, False), "only factors"),
    (c(1, (), 10, 30, False), "only factors"),
    (c(0, (), 10, 40, True), "carries no tensors"),
    (c(0, grads=None), "exact part"),
])
def test_malformed_powersgd_contributions_are_refused(body, why):
    with pytest.raises(WireError, match=why):
        decode_contribution(body, POWER)


def test_exact_sync_takes_one_phase_without_factors():
    ok = decode_contribution(c(0, grads=100, factors=None), EXACT)
    assert ok.grads.numel() == 100 and ok.factors is None and ok.phase == 0
    for body in (c(0, grads=100), c(1, (), None, 30, False), c(0, grads=300, factors=None)):
        with pytest.raises(WireError):
            decode_contribution(body, EXACT)


def test_follow_updates_are_in_the_layout_or_in_full_and_say_which():
    layout = decode_follow(encode_follow(FollowUpdate(RUN, 4, torch.ones(100), STAT, True)), EXACT)
    full = decode_follow(encode_follow(FollowUpdate(RUN, 4, torch.ones(300), STAT, False)), EXACT)
    assert (layout.in_layout, layout.grads.numel(), full.in_layout, full.grads.numel()) == (True, 100, False, 300)
    for grads, j in ((torch.ones(300), True), (torch.ones(100), False)):
        with pytest.raises(WireError, match="reduced gradient"):
            decode_follow(encode_follow(FollowUpdate(RUN, 4, grads, STAT, j)), EXACT)
    forged = msgpack.unpackb(encode_follow(FollowUpdate(RUN, 4, torch.ones(100), STAT, True)), raw=False,
                             ext_hook=lambda code, data: msgpack.ExtType(code, data))
    forged["j"] = 1
    with pytest.raises(WireError, match="true or false"):
        decode_follow(msgpack.packb(forged), EXACT)


def sums(x=10, p=40, q=30, dtype=torch.float32) -> tuple[torch.Tensor, ...]:
    return torch.ones(x, dtype=dtype), torch.full((p,), 2.0, dtype=dtype), torch.full((q,), 3.0, dtype=dtype)


def test_a_powersgd_step_follows_as_its_sums_in_the_compute_dtype():
    got = decode_follow(encode_follow(FollowUpdate(RUN, 4, None, STAT, True, factors=sums())), POWER)
    assert got.grads is None and got.in_layout and torch.equal(got.stat, STAT)
    assert [t.tolist() for t in got.factors] == [t.tolist() for t in sums()]
    assert all(t.dtype == torch.float32 for t in got.factors)  # the sums the replicas held, not wire-rounded
    # the same step in full is still taken (a step reduced before the follower was known)
    assert decode_follow(encode_follow(FollowUpdate(RUN, 4, torch.ones(100), STAT, True)), POWER).factors is None


def _forged(update: FollowUpdate, **fields) -> bytes:
    d = msgpack.unpackb(encode_follow(update), raw=False, ext_hook=lambda code, data: msgpack.ExtType(code, data))
    return msgpack.packb({**d, **fields})


@pytest.mark.parametrize("update,limits,why", [
    (FollowUpdate(RUN, 4, None, STAT, True, factors=sums(p=41)), POWER, "P sum"),
    (FollowUpdate(RUN, 4, None, STAT, True, factors=sums(q=29)), POWER, "Q sum"),
    (FollowUpdate(RUN, 4, None, STAT, True, factors=sums(x=100)), POWER, "exact sum"),
    (FollowUpdate(RUN, 4, None, STAT, True, factors=sums(dtype=torch.bfloat16)), POWER, "exact sum"),
    (FollowUpdate(RUN, 4, None, STAT, True, factors=sums()), EXACT, "sums this step exactly"),
    (FollowUpdate(RUN, 1, None, STAT, True, factors=sums()), dataclasses.replace(POWER, exact_until=2),
     "sums this step exactly"),  # a warm-up step of powersgd
    (FollowUpdate(RUN, 4, torch.ones(100), STAT, True, factors=sums()), POWER, "no flat gradient"),
])
def test_malformed_factored_follow_updates_are_refused(update, limits, why):
    with pytest.raises(WireError, match=why):
        decode_follow(encode_follow(update), limits)


def test_a_factored_follow_update_with_nan_or_of_the_wrong_shape_is_refused():
    x, p, q = sums()
    p[3] = float("nan")
    with pytest.raises(WireError, match="NaN"):
        decode_follow(encode_follow(FollowUpdate(RUN, 4, None, STAT, True, factors=(x, p, q))), POWER)
    good = FollowUpdate(RUN, 4, None, STAT, True, factors=sums())
    raw = msgpack.unpackb(encode_follow(good), raw=False, ext_hook=lambda code, data: msgpack.ExtType(code, data))
    for f, j in ((raw["f"][:2], True), (raw["f"], False), ("sums", True)):
        with pytest.raises(WireError):
            decode_follow(_forged(good, f=f, j=j), POWER)
    with pytest.raises(WireError, match="carries no tensors"):  # a skipped step has nothing to rebuild
        decode_follow(_forged(FollowUpdate(RUN, 4, None, None, True, skip=True), f=raw["f"]), POWER)


def test_a_reduce_probe_is_told_from_a_contribution_and_checked_like_one():
    assert decode_reduce(encode_probe(ReduceProbe(RUN, 3, 1, 1)), POWER) == ReduceProbe(RUN, 3, 1, 1)
    assert isinstance(decode_reduce(c(), POWER), Contribution)
    for probe, why in ((ReduceProbe("another run", 3, 1, 1), "another run"), (ReduceProbe(RUN, 3, 1, 2), "stage 1")):
        with pytest.raises(WireError, match=why):
            decode_reduce(encode_probe(probe), POWER)
    with pytest.raises(WireError, match="not a gradient contribution"):  # a probe is no contribution
        decode_contribution(encode_probe(ReduceProbe(RUN, 3, 1, 1)), POWER)
    assert [decode_probe_reply(encode_probe_reply(s)) for s in ("reducing", "idle", "ended", "elsewhere")] == [
        "reducing", "idle", "ended", "elsewhere"]
    for reply in (encode_probe_reply("done"), msgpack.packb({"k": "ctlr", "o": "idle"}), b"\x00"):
        with pytest.raises(WireError):
            decode_probe_reply(reply)


def test_a_reduce_command_carries_the_leaders_step_record_and_a_plain_one_carries_none():
    from protocol.control import Command, decode_command, encode_command
    record = bytes(range(200))
    back = decode_command(encode_command(Command("r" * 16, 3, 2, "reduce", ["a", "b"], record)), "r" * 16)
    assert back.record == record and back.candidates == ["a", "b"]
    assert decode_command(encode_command(Command("r" * 16, 3, 2, "apply")), "r" * 16).record == b""
    assert decode_command(encode_command(Command("r" * 16, 0, 0, "lease")), "r" * 16).op == "lease"


def test_a_reduce_reply_carries_the_replicas_newest_snapshot_and_a_bad_one_is_refused():
    import msgpack
    import pytest

    from protocol.control import CommandReply, decode_reply, encode_reply
    from protocol.wire import WireError
    r = CommandReply(3, 1, "ok", [0, 1], {"p": [0, 1]}, "", (2, "ab" * 32))
    assert decode_reply(encode_reply(r), 4).snapshot == (2, "ab" * 32)
    assert decode_reply(encode_reply(CommandReply(3, 1, "ok")), 4).snapshot is None
    bad = msgpack.unpackb(encode_reply(r))
    bad["h"] = [2, "short"]
    with pytest.raises(WireError):
        decode_reply(msgpack.packb(bad), 4)


def test_an_abort_to_a_banned_replica_carries_the_leaders_reason_and_a_long_one_is_refused():
    import msgpack
    import pytest

    from protocol.control import Command, decode_command, encode_command
    from protocol.wire import WireError
    why = "no contribution arrived from 12345678 within 61.3 s (slower than the swarm's slowest uplink)"
    back = decode_command(encode_command(Command("r" * 16, 3, 2, "abort", banned=["a"], why=why)), "r" * 16)
    assert (back.banned, back.why) == (["a"], why)
    assert "w" not in msgpack.unpackb(encode_command(Command("r" * 16, 3, 2, "abort", banned=["a"])))
    for bad in ("x" * 501, 7, [why]):
        body = {"k": "ctl", "r": "r" * 16, "s": 3, "a": 2, "o": "abort", "c": [], "b": ["a"], "w": bad}
        with pytest.raises(WireError, match="reason must be a short text"):
            decode_command(msgpack.packb(body), "r" * 16)
