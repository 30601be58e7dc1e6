"""Wire messages: exact byte counts (docs/algorithms.md 1.3; section 3 test 8) and roundtrips.

Malformed and hostile inputs are in test_wire_malformed.py. Tensor fields are checked against
an independent reading of the documented layout (one dtype byte, one ndim byte, ndim uint32
dims, raw little-endian data) and the msgpack sizes of every header field.
"""
from __future__ import annotations

import pytest
import torch

from protocol.codecs import WirePacker, WireTensors
from protocol.spec import preset
from protocol.wire import (
    HEADER_MAX_BYTES,
    ActivationMessage,
    ErrorReply,
    GradientMessage,
    Header,
    WireLimits,
    decode_message,
    encode_message,
    header_bytes,
    token_bytes,
    tokens_for_wire,
)

WIRE = [("fp32", "none"), ("bf16", "none"), ("fp64", "none"), ("fp32", "int8"), ("bf16", "int8"), ("fp64", "int8")]
ELEM = {"fp32": 4, "bf16": 2, "fp64": 8}


def spec_for(**kw):
    base = dict(d_model=64, n_heads=4, d_ff=128, seq_len=16, n_layers=2, stages=2, microbatch_size=4,
                batch_size=8, rank=8)
    base.update(kw)
    return preset("tiny", **base)


def act_msg(spec, B=2, step=3, mb=1, version=0, seed=0, to_stage=1):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, spec.vocab, (B, spec.seq_len + 1), generator=g)
    z = torch.randn(B, spec.seq_len, spec.boundary_width, generator=g, dtype=torch.float64)
    head = Header(spec.run_hash, step, mb, version, spec.codec, to_stage)
    return ActivationMessage(head, tokens_for_wire(tok, spec.vocab), WirePacker.for_spec(spec).pack(z)), tok


def grad_msg(spec, B=2, loss=2.5, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(B, spec.seq_len, spec.boundary_width, generator=g, dtype=torch.float64)
    head = Header(spec.run_hash, 7, 0, 0, spec.codec, 0)
    return GradientMessage(head, WirePacker.for_spec(spec).pack(z), loss)


# ---------------------------------------------------------------- independent msgpack sizes

def int_size(n):
    return 1 if 0 <= n < 128 else 2 if n < 256 else 3 if n < 2**16 else 5 if n < 2**32 else 9


def str_size(s):
    n = len(s.encode())
    return 1 + n if n < 32 else 2 + n if n < 256 else 3 + n


def ext_size(shape, data_bytes):
    """msgpack ext header + the tensor header (dtype, ndim, dims); the data itself excluded."""
    body = 2 + 4 * len(shape) + data_bytes
    ext = 2 if body in (1, 2, 4, 8, 16) else 3 if body < 256 else 4 if body < 2**16 else 6
    return ext + 2 + 4 * len(shape)


def expected_header(msg, vocab=256):
    h = msg.header
    n = 1 + str_size(h.run) + int_size(h.step) + int_size(h.attempt) + int_size(h.microbatch)
    n += int_size(h.basis_version)
    n += str_size(h.codec) + int_size(h.stage) + 2 * 8  # 8 one-letter keys so far
    p = msg.payload.values
    n += 2 + ext_size(p.shape, p.numel() * p.element_size())
    if msg.payload.scale is not None:
        s = msg.payload.scale
        n += 2 + ext_size(s.shape, s.numel() * s.element_size())
    if isinstance(msg, ActivationMessage):
        tb = token_bytes(vocab)
        n += str_size("act") + 2 + ext_size(msg.tokens.shape, msg.tokens.numel() * tb)
    else:
        n += str_size("grad") + 2 + 9  # "l": float64
    return n


# ---------------------------------------------------------------- byte counts (test 8)

@pytest.mark.parametrize("wire,quant", WIRE)
@pytest.mark.parametrize("B", [1, 2, 3, 4])
def test_activation_bytes_formula(wire, quant, B):
    spec = spec_for(wire_dtype=wire, quant=quant)
    msg, _ = act_msg(spec, B=B)
    buf = encode_message(msg)
    T, w, e, tb = spec.seq_len, spec.rank, ELEM[wire], token_bytes(spec.vocab)
    H = header_bytes(msg)
    assert H == expected_header(msg) <= HEADER_MAX_BYTES
    data = B * T * w * (1 if quant == "int8" else e) + B * (T + 1) * tb + (B * T * e if quant == "int8" else 0)
    assert len(buf) == data + H


@pytest.mark.parametrize("wire,quant", WIRE)
def test_gradient_bytes_formula(wire, quant):
    spec = spec_for(wire_dtype=wire, quant=quant)
    msg = grad_msg(spec, B=3)
    e = ELEM[wire]
    data = 3 * spec.seq_len * spec.rank * (1 if quant == "int8" else e)
    data += 3 * spec.seq_len * e if quant == "int8" else 0
    assert len(encode_message(msg)) == data + header_bytes(msg)
    assert header_bytes(msg) == expected_header(msg) <= HEADER_MAX_BYTES


def big_spec(codec, k=10):
    return preset("tiny", d_model=1024, n_heads=8, d_ff=2048, seq_len=128, vocab=32000, codec=codec, rank=k,
                  wire_dtype="bf16", microbatch_size=8, batch_size=8)


def test_header_constant_across_batch_size():
    spec = big_spec("subspace")
    sizes = [header_bytes(act_msg(spec, B=B)[0]) for B in range(1, 9)]
    assert len(set(sizes)) == 1 and sizes[0] <= HEADER_MAX_BYTES
    assert [header_bytes(grad_msg(spec, B=B)) for B in (1, 4, 8)] == [header_bytes(grad_msg(spec, B=1))] * 3


def test_header_worst_case_within_max():
    spec = spec_for(codec="bottleneck", wire_dtype="fp64", quant="int8", vocab=70000)
    msg, _ = act_msg(spec, B=4, step=2**53 - 1, mb=2**31 - 1, version=2**40, to_stage=2**16 - 1)
    assert header_bytes(msg) <= HEADER_MAX_BYTES
    assert header_bytes(grad_msg(spec)) <= HEADER_MAX_BYTES


def test_subspace_forward_message_80x_smaller_than_dense():
    """d=1024, k=10, bf16, vocab 32000 (uint16 ids): >= 80x fewer bytes per token than dense bf16."""
    B, T = 4, 128
    sub, _ = act_msg(big_spec("subspace"), B=B)
    dense, _ = act_msg(big_spec("dense"), B=B)
    per_sub, per_dense = len(encode_message(sub)) / (B * T), len(encode_message(dense)) / (B * T)
    assert per_sub == pytest.approx(10 * 2 + 2 * (T + 1) / T + header_bytes(sub) / (B * T))
    assert per_dense >= 2048
    assert per_dense / per_sub >= 80
    # both decode under their run's limits
    assert isinstance(decode_message(encode_message(sub), WireLimits.for_spec(big_spec("subspace"))), ActivationMessage)
    assert isinstance(decode_message(encode_message(dense), WireLimits.for_spec(big_spec("dense"))), ActivationMessage)


# ---------------------------------------------------------------- roundtrips

@pytest.mark.parametrize("wire,quant", WIRE)
@pytest.mark.parametrize("codec", ["subspace", "bottleneck", "dense"])
def test_activation_roundtrip(wire, quant, codec):
    spec = spec_for(wire_dtype=wire, quant=quant, codec=codec)
    msg, tok = act_msg(spec, B=3, step=123456, mb=3, version=2)
    out = decode_message(encode_message(msg), WireLimits.for_spec(spec, 2))
    assert isinstance(out, ActivationMessage)
    assert out.header == msg.header
    assert torch.equal(out.tokens, tok) and out.tokens.dtype == torch.int64
    assert out.payload.values.dtype == msg.payload.values.dtype
    assert torch.equal(out.payload.values.view(torch.uint8), msg.payload.values.view(torch.uint8))
    if quant == "int8":
        assert out.payload.scale.dtype == WirePacker.for_spec(spec).dtype
        assert torch.equal(out.payload.scale, msg.payload.scale)
    else:
        assert out.payload.scale is None


@pytest.mark.parametrize("wire,quant", WIRE)
def test_gradient_roundtrip(wire, quant):
    spec = spec_for(wire_dtype=wire, quant=quant)
    msg = grad_msg(spec, B=4, loss=3.14159)
    out = decode_message(encode_message(msg), WireLimits.for_spec(spec))
    assert isinstance(out, GradientMessage)
    assert out.header == msg.header and out.loss == 3.14159
    assert torch.equal(out.payload.values, msg.payload.values)
    nan = decode_message(encode_message(grad_msg(spec, loss=float("nan"))), WireLimits.for_spec(spec))
    assert nan.loss != nan.loss  # the default "no loss" travels as NaN


def test_error_reply_roundtrip():
    spec = spec_for()
    r = ErrorReply("basis version 3 is not live yet", "retry", {"version": 3})
    out = decode_message(encode_message(r), WireLimits.for_spec(spec))
    assert out == r
    assert header_bytes(r) == len(encode_message(r))


def token_roundtrip(vocab, tok):
    spec = spec_for(vocab=vocab)
    msg = ActivationMessage(Header(spec.run_hash, 0, 0, 0, spec.codec, 1), tokens_for_wire(tok, vocab),
                            WirePacker.for_spec(spec).pack(torch.zeros(2, 16, 8)))
    buf = encode_message(msg)
    out = decode_message(buf, WireLimits.for_spec(spec))
    return out.tokens, len(buf) - expected_header(msg, vocab) - 2 * 16 * 8 * 4


@pytest.mark.parametrize("vocab,tb", [(256, 1), (257, 2), (300, 2), (32000, 2), (65536, 2)])
def test_token_ids_exact(vocab, tb):
    """ids above 256 are exact (never bf16 values); uint8 up to 256 ids, uint16 up to 65536."""
    tok = torch.tensor([[0, 1, 255, vocab - 1] * 4 + [vocab // 2]] * 2)
    assert token_bytes(vocab) == tb
    out, token_data = token_roundtrip(vocab, tok)
    assert torch.equal(out, tok)
    assert token_data == 2 * 17 * tb


def test_token_ids_above_uint16_exact():
    """vocab > 65536: ids travel as int32, 4 bytes each, and ids >= 65536 arrive intact
    (not cut to their low 16 bits)."""
    tok = torch.tensor([[69999, 65536, 65535, 0] * 4 + [1]] * 2)
    out, token_data = token_roundtrip(70000, tok)
    assert out.tolist() == tok.tolist(), "token ids >= 65536 were cut to 16 bits on the wire"
    assert token_data == 2 * 17 * 4


def test_bf16_values_travel_as_their_own_bytes():
    spec = spec_for(wire_dtype="bf16")
    vals = torch.tensor([1.0, -2.5, 3.140625, 1e-30, 65280.0, -0.0], dtype=torch.bfloat16)
    z = vals.repeat(1, 16, 8)[:, :, :8].reshape(1, 16, 8).contiguous()
    msg = ActivationMessage(Header(spec.run_hash, 0, 0, 0, spec.codec, 1), tokens_for_wire(torch.zeros(1, 17), 256),
                            WireTensors(z))
    buf = encode_message(msg)
    assert z.view(torch.uint8).numpy().tobytes() in buf
    out = decode_message(buf, WireLimits.for_spec(spec))
    assert torch.equal(out.payload.values.view(torch.int16), z.view(torch.int16))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("wire,quant", [("bf16", "none"), ("fp32", "int8")])
def test_gpu_tensors_pack_on_the_device_and_arrive_on_it(wire, quant):
    """Packing casts on the GPU; the bytes leave through one pinned host copy and are the same bytes
    as a CPU pack; unpacking moves the wire bytes to the device and widens them there."""
    spec = spec_for(wire_dtype=wire, quant=quant)
    packer = WirePacker.for_spec(spec)
    z = torch.randn(2, spec.seq_len, spec.boundary_width, generator=torch.Generator().manual_seed(0))
    on_gpu = packer.pack(z.cuda())
    assert on_gpu.values.is_cuda
    head = Header(spec.run_hash, 0, 0, 0, spec.codec, 1)
    tok = tokens_for_wire(torch.zeros(2, spec.seq_len + 1, dtype=torch.long), spec.vocab)
    buf = encode_message(ActivationMessage(head, tok, on_gpu))
    assert buf == encode_message(ActivationMessage(head, tok, packer.pack(z)))
    msg = decode_message(buf, WireLimits.for_spec(spec))
    back = packer.unpack(msg.payload, torch.float32, "cuda")
    assert back.is_cuda and torch.equal(back.cpu(), packer.roundtrip(z))
