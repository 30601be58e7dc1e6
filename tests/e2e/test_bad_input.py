"""Bad input against a live peer: every malformed message gets a clear refusal, and the peer
keeps serving with its state unchanged (a valid message afterwards is still accepted)."""
from __future__ import annotations

import asyncio
import struct

import msgpack
import pytest
import torch

from protocol.codecs import WirePacker
from protocol.spec import RunSpec
from protocol.wire import (
    ActivationMessage,
    ErrorReply,
    GradientMessage,
    Header,
    WireLimits,
    decode_message,
    encode_message,
    tokens_for_wire,
)
from swarm.dht import SwarmDHT, close_node, start_dht
from swarm.net.transport import Transport, TransportError
from tests.e2e.conftest import wait_for_event


def _activation(spec: RunSpec, **change) -> ActivationMessage:
    B, T = spec.microbatch_size, spec.seq_len
    h = dict(run=spec.run_hash, step=0, microbatch=0, basis_version=0, codec=spec.codec, stage=1)
    h.update({k: v for k, v in change.items() if k in h})
    payload = change.get("payload", torch.randn(B, T, spec.boundary_width))
    tokens = change.get("tokens", tokens_for_wire(torch.randint(0, spec.vocab, (B, T + 1)), spec.vocab))
    return ActivationMessage(Header(**h), tokens, WirePacker.for_spec(spec).pack(payload))


@pytest.fixture
async def client(make_swarm):
    swarm = make_swarm(codec="subspace")
    maddrs = await asyncio.to_thread(swarm.start_coordinator)
    swarm.start_peer(1)
    ready = await asyncio.to_thread(wait_for_event, swarm, "stage1", "ready")
    dht = await asyncio.to_thread(start_dht, maddrs, ["/ip4/127.0.0.1/tcp/0"], None, True)
    p2p = transport = None
    try:
        signed = await SwarmDHT(dht).fetch_run_spec()
        spec = RunSpec.from_json(signed.spec_json)
        p2p = await dht.replicate_p2p()
        transport = Transport(p2p, f"subspace-swarm-{spec.run_hash}", timeout=30)
        yield spec, transport, ready[0]["peer_id"], swarm
    finally:
        await close_node(dht, p2p, transport)


async def _refusal(transport: Transport, peer: str, kind: str, body: bytes, name: str) -> str:
    reply = await transport.request(peer, kind, body)
    assert reply != b"", f"a bad message ({name}) was accepted"
    msg = decode_message(reply, WireLimits.for_spec(RunSpec()))
    assert isinstance(msg, ErrorReply)
    return msg.reason


async def test_live_peer_refuses_bad_input_and_keeps_serving(client):
    spec, transport, peer, swarm = client
    B, T, w = spec.microbatch_size, spec.seq_len, spec.boundary_width
    cases = {
        "garbage": (b"\x93\xc1garbage\xff" * 7, "not valid msgpack"),
        "not a map": (msgpack.packb([1, 2, 3]), "not a msgpack map"),
        "wrong shape": (encode_message(_activation(spec, payload=torch.randn(B, T, w + 1))), "shape"),
        "wrong dtype": (encode_message(ActivationMessage(
            Header(spec.run_hash, 0, 0, 0, spec.codec, 1), tokens_for_wire(torch.zeros(B, T + 1, dtype=torch.long),
                                                                           spec.vocab),
            WirePacker("bf16").pack(torch.randn(B, T, w)))), "dtype"),
        "wrong run hash": (encode_message(_activation(spec, run="0123456789abcdef")), "run"),
        "wrong basis version": (encode_message(_activation(spec, basis_version=3)), "basis version"),
        "far future step": (encode_message(_activation(spec, step=7)), "not for the step"),
        "wrong stage": (encode_message(_activation(spec, stage=2)), "stage"),
        "NaN payload": (encode_message(_activation(spec, payload=torch.full((B, T, w), float("nan")))), "NaN"),
        "token out of range": (encode_message(_activation(spec, tokens=torch.full((B, T + 1), 300, dtype=torch.int32))),
                               "token"),
        "int64 tokens": (encode_message(_activation(spec, tokens=torch.zeros(B, T + 1, dtype=torch.long))), "token"),
        "unknown microbatch": (encode_message(GradientMessage(Header(spec.run_hash, 0, 5, 0, spec.codec, 1),
                                                              WirePacker.for_spec(spec).pack(torch.randn(B, T, w)))),
                               "microbatch"),
    }
    for name, (body, words) in cases.items():
        kind = "grad" if name == "unknown microbatch" else "act"
        reason = await _refusal(transport, peer, kind, body, name)
        assert words.lower() in reason.lower(), f"{name}: unclear refusal {reason!r}"

    # an oversized frame is refused by the transport before its body is read
    with pytest.raises(TransportError, match="over the limit"):
        await transport.request(peer, "act", b"\x00" * (WireLimits.for_spec(spec).max_bytes + 1))

    # a truncated frame: the header promises more bytes than ever come
    _, reader, writer = await transport.p2p.call_binary_stream_handler(
        __import__("hivemind").p2p.PeerID.from_base58(peer), transport.protocol_id("act"))
    writer.write(struct.pack(">I", 10_000) + b"\x01\x02\x03")
    await writer.drain()
    writer.close()

    # still serving, and nothing above changed its state: microbatch 0 of step 0 is still new to it
    assert await transport.request(peer, "act", encode_message(_activation(spec))) == b""
    assert swarm.procs[-1][1].poll() is None, "the peer died"
