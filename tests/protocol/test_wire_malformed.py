"""Untrusted inbound bytes: `decode_message` returns a valid message or raises `WireError`, never
anything else (truncation, garbage, wrong dtype/shape/size/run/basis/codec, NaN, bad ExtType)."""
from __future__ import annotations

import math
import struct

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.codecs import WirePacker
from protocol.spec import preset
from protocol.wire import (
    ActivationMessage,
    ErrorReply,
    GradientMessage,
    Header,
    WireError,
    WireLimits,
    decode_message,
    encode_message,
    tokens_for_wire,
)

CODES = {torch.float32: 1, torch.bfloat16: 2, torch.float64: 3, torch.int8: 4, torch.uint8: 5,
         torch.int16: 6, torch.int32: 7, torch.int64: 8, torch.float16: 9}


def spec_for(**kw):
    base = dict(d_model=32, n_heads=2, d_ff=64, seq_len=4, n_layers=2, stages=2, microbatch_size=2,
                batch_size=2, rank=3)
    base.update(kw)
    return preset("tiny", **base)


SPEC = spec_for()
LIM = WireLimits.for_spec(SPEC)
B, T, W = 2, SPEC.seq_len, SPEC.rank


def ext(t: torch.Tensor, code: int | None = None, ndim: int | None = None, raw: bytes | None = None):
    """A tensor field written from the documented layout (independently of protocol.wire)."""
    t = t.contiguous()
    nd = t.ndim if ndim is None else ndim
    head = struct.pack(f"<BB{len(t.shape)}I", CODES[t.dtype] if code is None else code, nd, *t.shape)
    data = t.reshape(-1).view(torch.uint8).numpy().tobytes() if raw is None else raw
    return msgpack.ExtType(1, head + data)


def act_map(**over):
    d = {"k": "act", "r": SPEC.run_hash, "s": 5, "a": 0, "m": 1, "v": 0, "c": "subspace", "g": 1,
         "t": ext(torch.randint(0, 256, (B, T + 1), dtype=torch.uint8)),
         "p": ext(torch.randn(B, T, W, dtype=torch.float32))}
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def grad_map(**over):
    d = {"k": "grad", "r": SPEC.run_hash, "s": 5, "a": 2, "m": 1, "v": 0, "c": "subspace", "g": 0, "l": 1.5,
         "p": ext(torch.randn(B, T, W, dtype=torch.float32))}
    d.update(over)
    return {k: v for k, v in d.items() if v is not None}


def refused(buf, lim=LIM):
    with pytest.raises(WireError) as e:
        decode_message(buf, lim)
    assert str(e.value)  # one clear sentence


def valid_buf():
    tok = torch.randint(0, 256, (B, T + 1))
    msg = ActivationMessage(Header(SPEC.run_hash, 9, 1, 0, "subspace", 1), tokens_for_wire(tok, 256),
                            WirePacker.for_spec(SPEC).pack(torch.randn(B, T, W)))
    return encode_message(msg)


def test_hand_built_messages_are_accepted():
    """The helpers above build valid messages: every refusal below comes from its one change."""
    assert isinstance(decode_message(msgpack.packb(act_map()), LIM), ActivationMessage)
    assert isinstance(decode_message(msgpack.packb(grad_map()), LIM), GradientMessage)
    assert isinstance(decode_message(valid_buf(), LIM), ActivationMessage)


def test_every_truncation_refused():
    buf = valid_buf()
    for n in range(len(buf)):
        refused(buf[:n])
    refused(buf + b"\x00")  # trailing bytes
    refused(buf + buf)


BAD_FIELDS = {
    "run hash": dict(r="0" * 16), "basis version": dict(v=1), "codec": dict(c="dense"), "kind": dict(k="hello"),
    "kind missing": dict(k=None), "run missing": dict(r=None), "step missing": dict(s=None),
    "stage missing": dict(g=None), "tokens missing": dict(t=None), "payload missing": dict(p=None),
    "bool step": dict(s=True), "str step": dict(s="5"), "float step": dict(s=5.0), "negative step": dict(s=-1),
    "huge step": dict(s=2**60), "huge microbatch": dict(m=2**31), "huge stage": dict(g=2**16),
    "attempt missing": dict(a=None), "negative attempt": dict(a=-1), "huge attempt": dict(a=2**31),
    "bytes run": dict(r=SPEC.run_hash.encode()), "list codec": dict(c=["subspace"]),
    "wrong dtype fp64": dict(p=ext(torch.randn(B, T, W, dtype=torch.float64))),
    "wrong dtype bf16": dict(p=ext(torch.randn(B, T, W).to(torch.bfloat16))),
    "wrong dtype int8": dict(p=ext(torch.zeros(B, T, W, dtype=torch.int8))),
    "wrong width": dict(p=ext(torch.randn(B, T, W + 1))), "wrong T": dict(p=ext(torch.randn(B, T - 1, W))),
    "zero batch": dict(t=ext(torch.zeros(0, T + 1, dtype=torch.uint8)), p=ext(torch.randn(0, T, W))),
    "batch too big": dict(t=ext(torch.zeros(3, T + 1, dtype=torch.uint8)), p=ext(torch.randn(3, T, W))),
    "batch mismatch": dict(p=ext(torch.randn(1, T, W))), "payload 2-d": dict(p=ext(torch.randn(B * T, W))),
    "payload 4-d": dict(p=ext(torch.randn(1, B, T, W))), "tokens T": dict(t=ext(torch.zeros(B, T, dtype=torch.uint8))),
    "tokens 1-d": dict(t=ext(torch.zeros(B * (T + 1), dtype=torch.uint8))),
    "tokens float": dict(t=ext(torch.zeros(B, T + 1))),
    "tokens int64": dict(t=ext(torch.zeros(B, T + 1, dtype=torch.int64))),
    "token 256 in a byte vocab": dict(t=ext(torch.full((B, T + 1), 256, dtype=torch.int32))),
    "token 256 as uint16": dict(t=ext(torch.full((B, T + 1), 256, dtype=torch.int16), code=10)),
    "negative token": dict(t=ext(torch.full((B, T + 1), -1, dtype=torch.int32))),
    "NaN payload": dict(p=ext(torch.full((B, T, W), float("nan")))),
    "inf payload": dict(p=ext(torch.full((B, T, W), float("inf")))),
    "-inf payload": dict(p=ext(torch.full((B, T, W), -float("inf")))),
    "scale without int8": dict(x=ext(torch.ones(B, T, 1))),
    "unknown ext type": dict(p=msgpack.ExtType(2, b"\x01\x00\x00\x00\x80\x3f")),
    "unknown dtype code": dict(p=ext(torch.randn(B, T, W), code=99)),
    "ndim 5": dict(p=ext(torch.randn(1, 1, B, T, W))), "ext empty": dict(p=msgpack.ExtType(1, b"")),
    "ext one byte": dict(p=msgpack.ExtType(1, b"\x01")),
    "shape header cut": dict(p=msgpack.ExtType(1, b"\x01\x03\x02\x00\x00\x00\x04")),
    "data one byte short": dict(p=ext(torch.randn(B, T, W), raw=bytes(B * T * W * 4 - 1))),
    "data one byte long": dict(p=ext(torch.randn(B, T, W), raw=bytes(B * T * W * 4 + 1))),
    "ndim lies": dict(p=ext(torch.randn(B, T, W), ndim=2)),
    "payload as bin": dict(p=b"\x00" * 8), "payload as list": dict(p=[1.0, 2.0]),
}


@pytest.mark.parametrize("case", sorted(BAD_FIELDS))
def test_bad_activation_refused(case):
    refused(msgpack.packb(act_map(**BAD_FIELDS[case])))


@pytest.mark.parametrize("case", ["loss int", "loss str", "NaN payload", "wrong codec", "wrong width", "wrong dtype"])
def test_bad_gradient_refused(case):
    over = {"loss int": dict(l=1), "loss str": dict(l="1.5"),
            "NaN payload": dict(p=ext(torch.full((B, T, W), math.nan))),
            "wrong codec": dict(c="bottleneck"), "wrong width": dict(p=ext(torch.randn(B, T, 1))),
            "wrong dtype": dict(p=ext(torch.randn(B, T, W, dtype=torch.float64)))}[case]
    refused(msgpack.packb(grad_map(**over)))


@pytest.mark.parametrize("wire", ["bf16", "fp32"])
def test_int8_scale_checks(wire):
    spec = spec_for(quant="int8", wire_dtype=wire)
    lim = WireLimits.for_spec(spec)
    sd = torch.bfloat16 if wire == "bf16" else torch.float32
    good = dict(r=spec.run_hash, p=ext(torch.ones(B, T, W, dtype=torch.int8)), x=ext(torch.ones(B, T, 1).to(sd)))
    assert isinstance(decode_message(msgpack.packb(act_map(**good)), lim), ActivationMessage)
    for bad in (dict(x=None), dict(x=ext(torch.ones(B, T, 2).to(sd))),
                dict(x=ext(torch.ones(B, T, 1, dtype=torch.float64))),
                dict(x=ext(torch.full((B, T, 1), math.nan).to(sd))),
                dict(x=ext(torch.full((B, T, 1), math.inf).to(sd))),
                dict(p=ext(torch.ones(B, T, W).to(sd)))):
        refused(msgpack.packb(act_map(**{**good, **bad})), lim)


def test_bf16_nan_refused():
    spec = spec_for(wire_dtype="bf16")
    p = torch.randn(B, T, W).to(torch.bfloat16)
    p[1, 2, 0] = math.nan
    refused(msgpack.packb(act_map(r=spec.run_hash, p=ext(p))), WireLimits.for_spec(spec))


def test_basis_version_window():
    """Only this peer's version, or (while a switch is scheduled) the next one."""
    assert isinstance(decode_message(msgpack.packb(act_map(v=3)), WireLimits.for_spec(SPEC, 3)), ActivationMessage)
    for v in (2, 4, 5):
        refused(msgpack.packb(act_map(v=v)), WireLimits.for_spec(SPEC, 3))
    nxt = WireLimits.for_spec(SPEC, 3, accept_next_basis=True)
    assert decode_message(msgpack.packb(act_map(v=4)), nxt).header.basis_version == 4
    assert decode_message(msgpack.packb(grad_map(v=3)), nxt).header.basis_version == 3
    for v in (2, 5):
        refused(msgpack.packb(act_map(v=v)), nxt)


def test_oversized_refused_before_parsing():
    buf = valid_buf()
    refused(buf, WireLimits.for_spec(SPEC, max_bytes=len(buf) - 1))
    assert isinstance(decode_message(buf, WireLimits.for_spec(SPEC, max_bytes=len(buf))), ActivationMessage)
    refused(b"\x00" * (LIM.max_bytes + 1))
    refused(msgpack.packb(act_map(pad="x" * LIM.max_bytes)))


@pytest.mark.parametrize("buf", [b"", b"\xc1", b"\x90", b"\x01", b"\xa3act", msgpack.packb([1, 2]),
                                 msgpack.packb({1: 2}), msgpack.packb(None), b"\x91" * 5000 + b"\xc0",
                                 b"\x81\xa1k" * 3000 + b"\xc0", msgpack.packb({"k": "err"}),
                                 msgpack.packb({"k": "err", "e": 5})])
def test_garbage_refused(buf):
    refused(buf)


@pytest.mark.parametrize("data", ["text", None, 12, [1, 2]])
def test_not_bytes_refused(data):
    refused(data)


def test_kind_as_tensor_refused():
    refused(msgpack.packb({"k": ext(torch.zeros(2))}))
    refused(msgpack.packb(act_map(r=ext(torch.zeros(2)))))


# ---------------------------------------------------------------- property tests

def check_outcome(buf, lim=LIM):
    """The contract: a WireError, or a message that satisfies every documented check."""
    try:
        msg = decode_message(buf, lim)
    except WireError:
        return
    if isinstance(msg, ErrorReply):
        assert isinstance(msg.reason, str) and isinstance(msg.detail, dict)
        return
    assert isinstance(msg, (ActivationMessage, GradientMessage))
    h = msg.header
    assert (h.run, h.codec, h.basis_version) == (lim.run, lim.codec, lim.basis_version)
    p = msg.payload.values
    assert p.dtype == lim.value_dtype and p.shape[1:] == (lim.seq_len, lim.width)
    assert 1 <= p.shape[0] <= lim.max_microbatch and bool(torch.isfinite(p.float()).all())
    if isinstance(msg, ActivationMessage):
        t = msg.tokens
        assert t.shape == (p.shape[0], lim.seq_len + 1) and int(t.min()) >= 0 and int(t.max()) < lim.vocab


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes(buf):
    check_outcome(buf)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=6),
       st.sampled_from(["flip", "insert", "delete"]))
def test_mutated_valid_message(edits, how):
    buf = bytearray(valid_buf())
    for pos, byte in edits:
        i = pos % (len(buf) + (how == "insert"))
        if how == "flip":
            buf[i] ^= byte or 1
        elif how == "insert":
            buf.insert(i, byte)
        elif len(buf) > 1:
            del buf[i]
    check_outcome(bytes(buf))


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=8) | st.builds(msgpack.ExtType, st.integers(0, 3), st.binary(max_size=40)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=10)


@FUZZ
@given(st.sampled_from(["k", "r", "s", "a", "m", "v", "c", "g", "t", "p", "x", "l", "e", "d", "o"]), msgpack_values,
       st.sampled_from(["act", "grad", "err"]))
def test_field_replaced_by_any_value(key, value, kind):
    err = {"k": "err", "e": "no", "o": "retry", "d": {}}
    base = act_map() if kind == "act" else grad_map() if kind == "grad" else err
    base[key] = value
    check_outcome(msgpack.packb(base))
