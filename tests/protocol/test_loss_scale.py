"""fp16 and its loss scale in the protocol: the scale's rule (protocol/loss_scale.py), the flags that
carry an overflow and a skip on the wire (gradient messages, control commands and replies,
contributions, follow updates) and their validation, and what `--dtype auto` resolves to."""
from __future__ import annotations

import msgpack
import pytest
import torch

from protocol.codecs import WireTensors
from protocol.control import (
    Command,
    CommandReply,
    Contribution,
    FlatLimits,
    decode_command,
    decode_contribution,
    decode_reply,
    encode_command,
    encode_contribution,
    encode_reply,
)
from protocol.loss_scale import GROWTH_INTERVAL, INITIAL_SCALE, MIN_SCALE, LossScale, loss_scale_for
from protocol.spec import RunSpec, SpecError, preset, resolve_dtype
from protocol.state_wire import FollowUpdate, decode_follow, encode_follow
from protocol.wire import GradientMessage, Header, WireError, WireLimits, decode_message, encode_message

RUN = "0123456789abcdef"
EXACT = FlatLimits(RUN, 1, 100, torch.float32, (8, 2), 4, full_numel=300)
POWER = FlatLimits(RUN, 1, 100, torch.float32, (8, 2), 4, ((10, 40), (0, 30)), torch.bfloat16, 300)


def _raw(body: bytes) -> dict:
    return msgpack.unpackb(body, raw=False, ext_hook=lambda code, data: msgpack.ExtType(code, data))


def test_the_scale_halves_on_an_overflow_and_doubles_after_an_interval_of_good_steps():
    s = LossScale()
    assert (s.scale, s.interval) == (2.0 ** 16, 2000) == (INITIAL_SCALE, GROWTH_INTERVAL)  # GradScaler's defaults
    s.update(True)
    assert (s.scale, s.good_steps) == (2.0 ** 15, 0)
    for _ in range(GROWTH_INTERVAL - 1):
        s.update(False)
    assert (s.scale, s.good_steps) == (2.0 ** 15, GROWTH_INTERVAL - 1)
    s.update(False)
    assert (s.scale, s.good_steps) == (2.0 ** 16, 0)
    s.update(False)
    s.update(True)  # an overflow also restarts the count of good steps
    assert (s.scale, s.good_steps) == (2.0 ** 15, 0)
    for _ in range(100):
        s.update(True)
    assert s.scale == MIN_SCALE > 0  # never zero, however many overflows in a row


def test_only_an_fp16_run_scales_its_loss():
    assert loss_scale_for(preset("tiny", dtype="fp16")) == LossScale()
    assert all(loss_scale_for(preset("tiny", dtype=d)) is None for d in ("fp32", "fp64", "bf16"))


def test_a_run_spec_takes_fp16_and_never_auto():
    assert RunSpec.from_json(preset("tiny", dtype="fp16").to_json()).dtype == "fp16"
    with pytest.raises(SpecError, match="auto"):
        preset("tiny", dtype="auto")


def test_auto_is_bf16_on_a_card_that_has_it_fp16_on_one_that_has_not_and_fp32_on_the_cpu(monkeypatch):
    assert resolve_dtype("auto", "cpu") == "fp32" and resolve_dtype("auto", None) == "fp32"
    assert resolve_dtype("fp64", "cuda") == "fp64" and resolve_dtype(None, "cuda") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for bf16, want in ((True, "bf16"), (False, "fp16")):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True, b=bf16: b)
        assert resolve_dtype("auto", "cuda:0") == want
        assert resolve_dtype("auto", "cpu") == "fp32"


def test_a_gradient_message_carries_the_overflow_flag_only_when_set():
    spec = preset("tiny", stages=2, wire_dtype="fp32")
    lim = WireLimits.for_spec(spec)
    payload = WireTensors(torch.zeros(2, spec.seq_len, spec.rank), None)
    header = Header(spec.run_hash, 3, 1, 0, spec.codec, 0)
    plain, flagged = (encode_message(GradientMessage(header, payload, 1.5, o)) for o in (False, True))
    assert "o" not in _raw(plain)  # runs without loss scaling send what they always sent
    assert decode_message(plain, lim).overflow is False and decode_message(flagged, lim).overflow is True
    forged = _raw(flagged)
    forged["o"] = 1
    with pytest.raises(WireError, match="true or false"):
        decode_message(msgpack.packb(forged), lim)


def test_commands_and_replies_carry_the_skip_and_the_overflow():
    for skip in (False, True):
        body = encode_command(Command(RUN, 5, 2, "apply", skip=skip))
        assert decode_command(body, RUN).skip is skip and ("v" in _raw(body)) is skip
        reply = decode_reply(encode_reply(CommandReply(5, 2, "ok", [0, 1], {"p": [0, 1]}, overflow=skip)), 4)
        assert reply.overflow is skip and reply.contributors == {"p": [0, 1]}
    forged = _raw(encode_command(Command(RUN, 5, 2, "apply", skip=True)))
    forged["v"] = "yes"
    with pytest.raises(WireError, match="skip flag"):
        decode_command(msgpack.packb(forged), RUN)


@pytest.mark.parametrize("lim", [EXACT, POWER], ids=["exact", "powersgd"])
def test_an_overflowed_contribution_carries_microbatches_and_no_numbers(lim):
    got = decode_contribution(encode_contribution(Contribution(RUN, 3, 1, 1, [0, 2], None, overflow=True)), lim)
    assert (got.overflow, got.microbatches, got.grads, got.factors, got.stat) == (True, [0, 2], None, None, None)
    with_numbers = encode_contribution(Contribution(RUN, 3, 1, 1, [0], torch.ones(lim.numel), overflow=True))
    second_round = encode_contribution(Contribution(RUN, 3, 1, 1, [], None, phase=1, overflow=True))
    with pytest.raises(WireError, match="overflowed contribution"):
        decode_contribution(with_numbers, lim)
    with pytest.raises(WireError, match="overflowed contribution" if lim.phases else "phase"):
        decode_contribution(second_round, lim)


def test_a_skipped_step_is_followed_without_numbers():
    got = decode_follow(encode_follow(FollowUpdate(RUN, 4, None, None, True, skip=True)), EXACT)
    assert (got.step, got.skip, got.grads, got.stat) == (4, True, None, None)
    forged = _raw(encode_follow(FollowUpdate(RUN, 4, torch.ones(100), None, True)))
    forged["v"] = True
    with pytest.raises(WireError, match="no tensors"):
        decode_follow(msgpack.packb(forged), EXACT)
    without = _raw(encode_follow(FollowUpdate(RUN, 4, None, None, True, skip=True)))
    del without["v"]  # no skip: the gradient must be there
    with pytest.raises(WireError, match="reduced gradient"):
        decode_follow(msgpack.packb(without), EXACT)
