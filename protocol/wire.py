"""Messages on the wire: msgpack maps with tensors as an ExtType, validated on the way in.

Layout of a tensor (ExtType code 1): one byte dtype code, one byte ndim, ndim little-endian
uint32 dims, then the raw little-endian bytes. bf16 travels as its own two bytes.

An activation message is a msgpack map with one-letter keys:
    k kind  r run hash  s step  a attempt  m microbatch index  v basis version  c codec  g target stage
    t tokens [B, T+1] (uint8 / uint16 / int32 by vocab)  p payload [B, T, w]  x int8 scale [B, T, 1]
A gradient message has the same header without tokens (the sender kept them) and `l`, the
tail's loss on that microbatch, so the head learns the loss with no extra round trip, and in
an fp16 run `o` true when the gradient overflowed (inf or NaN): its payload is then zeros that
stand in for it, the receiver passes the flag on upstream, and the step is skipped everywhere
(protocol/loss_scale.py). `o` is left out when false.

Bytes per activation message = B*T*w*e + B*(T+1)*tb (+ B*T*e' for int8 scales) + H, where
e is the wire dtype's size, tb the token id size, and H the header: the map keys, the small
integers and the strings, and the two tensor headers (2 + 4*ndim bytes each). H depends only
on the run hash and codec strings and the integers' magnitudes (msgpack packs small ints
smaller), and is at most HEADER_MAX_BYTES. `header_bytes()` computes it exactly.

Every inbound buffer is untrusted: `decode_message` checks the size limit before parsing,
then schema, kinds, dtypes, shapes against the run spec, run hash, basis version, token
range and finiteness, and raises `WireError` (one clear sentence) and nothing else.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import msgpack
import torch

from protocol.codecs import WirePacker, WireTensors
from protocol.spec import WIRE_DTYPES, RunSpec

TENSOR_EXT = 1
HEADER_MAX_BYTES = 160
DTYPE_CODES: dict[torch.dtype, int] = {
    torch.float32: 1, torch.bfloat16: 2, torch.float64: 3, torch.int8: 4,
    torch.uint8: 5, torch.int16: 6, torch.int32: 7, torch.int64: 8, torch.float16: 9,
}
CODE_DTYPES = {v: k for k, v in DTYPE_CODES.items()}
UINT16_CODE = 10  # torch.uint16 (decoded through int16 bits: few ops support uint16 itself)

# Every kind of message, and so every libp2p protocol a peer serves, is spelled here once.
KIND_ACTIVATION = "act"  # forward: a boundary activation, head -> tail
KIND_GRADIENT = "grad"  # backward: a boundary gradient, tail -> head
KIND_ERROR = "err"  # a refusal, as a reply
KIND_BASIS = "basis"  # a signed basis update, coordinator -> peers (protocol/basis_update.py)
KIND_STATS = "stats"  # a stage's re-fit statistic, peer -> coordinator (protocol/basis_update.py)
KIND_CONTROL = "ctl"  # the step driver's commands: status, reduce, apply, abort (protocol/control.py)
KIND_DRIVE = "ctl:drive"  # not a protocol: the right to send the commands that change a step (reduce, apply, abort)
KIND_REDUCE = "red"  # one replica's gradient contribution to its stage's all-reduce (protocol/control.py)
KIND_FOLLOW = "fol"  # a stage's reduced gradient forwarded to a replica still catching up (protocol/control.py)
KIND_STATE = "state"  # a stage's state, downloaded by a joining replica (protocol/state_wire.py)
KIND_WORK = "work"  # the leading head's signed record of who worked a re-fit step, -> coordinator
KIND_DATA_REPORT = "datarep"  # a head's report of a leader's step record that its data contradicts, -> coordinator
KIND_REFUSAL_REPORT = "refrep"  # a head's signed refusal of the leader's reduce (protocol/refusal.py), -> coordinator
KIND_SNAPSHOT = "snap"  # a stage's snapshot at a step boundary: offered, listed, fetched (protocol/snapshot_wire.py)
KIND_RECORDS = "rec"  # the coordinator-signed records a peer holds (spec, lease, basis chain), re-served (record_wire)


class WireError(ValueError):
    """An inbound message that must be refused; the text says why in one sentence."""


def token_dtype(vocab: int) -> str:
    return "uint8" if vocab <= 256 else ("uint16" if vocab <= 65536 else "int32")


def token_bytes(vocab: int) -> int:
    return {"uint8": 1, "uint16": 2, "int32": 4}[token_dtype(vocab)]


# ---------------------------------------------------------------- tensors <-> ExtType

def host_copy(t: torch.Tensor) -> torch.Tensor:
    """`t` on the CPU, contiguous. From a GPU: one copy into pinned (page-locked) memory, which
    the DMA engine fills directly, and a wait for that copy alone (an event, not the whole
    stream: work another thread queued after it, the next microbatch say, is not waited for).
    The only move a wire tensor makes."""
    t = t.detach()
    if t.device.type != "cuda":
        return t.to("cpu").contiguous()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record(torch.cuda.current_stream(t.device))
    copied.synchronize()
    return host


def pack_tensor(t: torch.Tensor) -> msgpack.ExtType:
    """`t` as the msgpack extension that every message carries its tensors in (the layout above)."""
    t = host_copy(t)
    code = UINT16_CODE if t.dtype == torch.uint16 else DTYPE_CODES[t.dtype]
    head = struct.pack(f"<BB{t.ndim}I", code, t.ndim, *t.shape)
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    return msgpack.ExtType(TENSOR_EXT, head + raw)


def _unpack_tensor(data: bytes) -> torch.Tensor:
    if len(data) < 2:
        raise WireError("a tensor field is truncated (no dtype/ndim header).")
    code, ndim = data[0], data[1]
    if code not in CODE_DTYPES and code != UINT16_CODE:
        raise WireError(f"a tensor field has unknown dtype code {code}.")
    if ndim > 4:
        raise WireError(f"a tensor field has {ndim} dimensions; at most 4 are allowed.")
    off = 2 + 4 * ndim
    if len(data) < off:
        raise WireError("a tensor field's shape header is truncated.")
    shape = struct.unpack(f"<{ndim}I", data[2:off])
    dtype = torch.int16 if code == UINT16_CODE else CODE_DTYPES[code]
    itemsize = torch.tensor([], dtype=dtype).element_size()
    n = math.prod(shape)
    if len(data) - off != n * itemsize:
        raise WireError(f"a tensor field of shape {list(shape)} has {len(data) - off} bytes, "
                        f"expected {n * itemsize}.")
    if n == 0:
        t = torch.empty(shape, dtype=dtype)
    else:
        t = torch.frombuffer(bytearray(data[off:]), dtype=torch.uint8).view(dtype).reshape(shape)
    if code == UINT16_CODE:
        t = t.to(torch.int32) & 0xFFFF
    return t


def ext_hook(code: int, data: bytes):
    """msgpack's `ext_hook` for our messages: a tensor extension back to a tensor, WireError for any other."""
    if code != TENSOR_EXT:
        raise WireError(f"unknown msgpack extension type {code}.")
    return _unpack_tensor(data)


# ---------------------------------------------------------------- messages

@dataclass
class Header:
    run: str
    step: int
    microbatch: int
    basis_version: int
    codec: str
    stage: int  # the stage this message is addressed to
    attempt: int = 0  # the step driver's attempt at this step (a retry after a failure is a new attempt)


@dataclass
class ActivationMessage:
    header: Header
    tokens: torch.Tensor  # [B, T+1] integer ids
    payload: WireTensors


@dataclass
class GradientMessage:
    header: Header
    payload: WireTensors
    loss: float = float("nan")
    overflow: bool = False  # fp16: the gradient overflowed; the payload is zeros standing in for it


@dataclass
class ErrorReply:
    reason: str
    code: str = "refused"  # refused | retry (e.g. a future step or a basis switch in progress)
    detail: dict = field(default_factory=dict)


Message = ActivationMessage | GradientMessage | ErrorReply


def _header_map(kind: str, h: Header) -> dict:
    return {"k": kind, "r": h.run, "s": h.step, "a": h.attempt, "m": h.microbatch, "v": h.basis_version, "c": h.codec,
            "g": h.stage}


def encode_message(msg: Message) -> bytes:
    if isinstance(msg, ErrorReply):
        return msgpack.packb({"k": KIND_ERROR, "e": msg.reason, "o": msg.code, "d": msg.detail})
    if isinstance(msg, ActivationMessage):
        d = _header_map(KIND_ACTIVATION, msg.header)
        d["t"] = pack_tensor(msg.tokens)
    else:
        d = _header_map(KIND_GRADIENT, msg.header)
        d["l"] = float(msg.loss)
        if msg.overflow:
            d["o"] = True
    d["p"] = pack_tensor(msg.payload.values)
    if msg.payload.scale is not None:
        d["x"] = pack_tensor(msg.payload.scale)
    return msgpack.packb(d)


def tokens_for_wire(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Token ids in the smallest integer type that holds the vocab."""
    return tokens.to({"uint8": torch.uint8, "uint16": torch.uint16, "int32": torch.int32}[token_dtype(vocab)])


def encode_activation(header: Header, tokens: torch.Tensor, payload: WireTensors, vocab: int) -> bytes:
    """The bytes of one activation message: token ids in their wire type, the packed boundary tensor."""
    return encode_message(ActivationMessage(header, tokens_for_wire(tokens, vocab), payload))


def encode_gradient(header: Header, payload: WireTensors, loss: float = float("nan"), overflow: bool = False) -> bytes:
    """The bytes of one gradient message (with the tail's loss on that microbatch, and the fp16 overflow flag)."""
    return encode_message(GradientMessage(header, payload, loss, overflow))


@dataclass(frozen=True)
class WireLimits:
    """What a receiving stage accepts: derived from the run spec and its current basis version."""

    run: str
    codec: str
    vocab: int
    seq_len: int
    width: int
    max_microbatch: int
    value_dtype: torch.dtype
    scale_dtype: torch.dtype | None
    basis_version: int
    max_bytes: int
    accept_next_basis: bool = False  # also accept basis_version + 1 (the caller checks it against the step)

    @classmethod
    def for_spec(cls, spec: RunSpec, basis_version: int = 0, max_bytes: int | None = None,
                 accept_next_basis: bool = False) -> WireLimits:
        packer = WirePacker.for_spec(spec)
        scale = WIRE_DTYPES[spec.wire_dtype] if spec.quant == "int8" else None
        per_token = spec.boundary_width * packer.bytes_per_number() + token_bytes(spec.vocab) + 8
        limit = max_bytes or (spec.microbatch_size * (spec.seq_len + 1) * per_token + 4096)
        return cls(spec.run_hash, spec.codec, spec.vocab, spec.seq_len, spec.boundary_width,
                   spec.microbatch_size, packer.value_dtype, scale, basis_version, limit, accept_next_basis)


def need(cond: bool, msg: str) -> None:
    """Raise `WireError(msg)` unless `cond`: every decoder's one way to refuse a message."""
    if not cond:
        raise WireError(msg)


def _check_header(d: dict, lim: WireLimits) -> Header:
    for key, typ, name in (("r", str, "run hash"), ("s", int, "step"), ("a", int, "attempt"), ("m", int, "microbatch"),
                           ("v", int, "basis version"), ("c", str, "codec"), ("g", int, "stage")):
        need(isinstance(d.get(key), typ) and not isinstance(d.get(key), bool),
             f"message field '{name}' is missing or not a {typ.__name__}.")
    need(d["r"] == lim.run, f"message is for run {d['r'][:16]!r}, this peer serves run {lim.run!r}.")
    need(d["c"] == lim.codec, f"message uses codec {d['c'][:16]!r}, the run uses {lim.codec!r}.")
    need(d["v"] == lim.basis_version or (lim.accept_next_basis and d["v"] == lim.basis_version + 1),
         f"message uses basis version {d['v']}, this peer is on version {lim.basis_version}.")
    need(0 <= d["s"] < 2**53 and 0 <= d["a"] < 2**31 and 0 <= d["m"] < 2**31 and 0 <= d["g"] < 2**16,
         "message step, attempt, microbatch or stage is out of range.")
    return Header(d["r"], d["s"], d["m"], d["v"], d["c"], d["g"], d["a"])


def _check_payload(d: dict, lim: WireLimits, batch: int | None) -> WireTensors:
    p = d.get("p")
    need(isinstance(p, torch.Tensor), "message has no payload tensor.")
    need(p.dtype == lim.value_dtype, f"payload dtype {p.dtype} is not the run's wire dtype {lim.value_dtype}.")
    need(p.ndim == 3 and p.shape[1] == lim.seq_len and p.shape[2] == lim.width
         and 1 <= p.shape[0] <= lim.max_microbatch and (batch is None or p.shape[0] == batch),
         f"payload shape {list(p.shape)} does not match [B<={lim.max_microbatch}, {lim.seq_len}, {lim.width}].")
    scale = d.get("x")
    if lim.scale_dtype is not None:
        need(isinstance(scale, torch.Tensor) and scale.dtype == lim.scale_dtype
             and tuple(scale.shape) == (p.shape[0], p.shape[1], 1),
             "int8 payload needs a scale tensor of shape [B, T, 1] in the wire dtype.")
        need(bool(torch.isfinite(scale).all()), "payload scale has NaN or infinite values.")
    else:
        need(scale is None, "payload carries a scale but the run does not quantize.")
    if p.is_floating_point():
        need(bool(torch.isfinite(p).all()), "payload has NaN or infinite values.")
    return WireTensors(p, scale)


def refusal_reason(data: bytes) -> str | None:
    """The reason of a refusal (`ErrorReply`) in a reply of any kind, or None if it is not one: what a caller
    shows instead of "malformed" when a peer said no to a request whose answer has its own format."""
    try:
        d = msgpack.unpackb(bytes(data[:8192]), raw=False, strict_map_key=True, max_str_len=4096, max_bin_len=0,
                            max_array_len=64, max_map_len=32)
    except Exception:  # not msgpack, or cut off: not a refusal
        return None
    if isinstance(d, dict) and d.get("k") == KIND_ERROR and isinstance(d.get("e"), str):
        return d["e"][:1000]
    return None


def decode_message(data: bytes, lim: WireLimits) -> Message:
    """Parse and validate one inbound message; raises WireError and nothing else."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("message is not a byte string.")
    if len(data) > lim.max_bytes:
        raise WireError(f"message of {len(data)} bytes is over the limit of {lim.max_bytes}.")
    try:
        d = msgpack.unpackb(bytes(data), ext_hook=ext_hook, raw=False, strict_map_key=True,
                            max_str_len=4096, max_bin_len=0, max_array_len=64, max_map_len=32)
    except WireError:
        raise
    except Exception as e:  # msgpack raises many types for bad bytes: all mean the same to the sender
        raise WireError(f"message is not valid msgpack ({type(e).__name__}).") from None
    need(isinstance(d, dict), "message is not a msgpack map.")
    kind = d.get("k")
    if kind == KIND_ERROR:
        need(isinstance(d.get("e"), str), "error reply has no reason.")
        return ErrorReply(d["e"][:1000], str(d.get("o", "refused"))[:32],
                          d.get("d") if isinstance(d.get("d"), dict) else {})
    need(kind in (KIND_ACTIVATION, KIND_GRADIENT), f"unknown message kind {str(kind)[:16]!r}.")
    header = _check_header(d, lim)
    if kind == KIND_GRADIENT:
        loss = d.get("l", float("nan"))
        need(isinstance(loss, float), "gradient message loss must be a float.")
        overflow = d.get("o", False)
        need(isinstance(overflow, bool), "gradient message overflow flag must be true or false.")
        return GradientMessage(header, _check_payload(d, lim, None), loss, overflow)
    t = d.get("t")
    need(isinstance(t, torch.Tensor), "activation message has no token tensor.")
    need(not t.is_floating_point() and t.dtype != torch.int64 or t.dtype == torch.int32,
         f"token ids must travel as uint8/uint16/int32, not {t.dtype}.")
    need(t.ndim == 2 and t.shape[1] == lim.seq_len + 1 and 1 <= t.shape[0] <= lim.max_microbatch,
         f"token shape {list(t.shape)} does not match [B, {lim.seq_len + 1}].")
    t = t.long()
    need(bool(((t >= 0) & (t < lim.vocab)).all()), f"token ids must be in [0, {lim.vocab}).")
    return ActivationMessage(header, t, _check_payload(d, lim, t.shape[0]))


def header_bytes(msg: Message) -> int:
    """Bytes of `msg` that are not tensor data: keys, scalars, strings and tensor headers."""
    n = len(encode_message(msg))
    if isinstance(msg, ErrorReply):
        return n
    data = msg.payload.values.numel() * msg.payload.values.element_size()
    if msg.payload.scale is not None:
        data += msg.payload.scale.numel() * msg.payload.scale.element_size()
    if isinstance(msg, ActivationMessage):
        data += msg.tokens.numel() * msg.tokens.element_size()
    return n - data
