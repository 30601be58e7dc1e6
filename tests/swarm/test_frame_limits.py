"""Each kind's frame limit (docs/security.md, Sizes): a replica serves every kind with the limit `frame_limits` sets
for it (swarm/replicas/replica.py), so a frame one byte over its kind's limit is refused from its length field alone,
before its body is read, and a frame exactly at the limit reaches the handler. The limits fit what they are for: a
boundary message is one microbatch (a signed one fits, two microbatches' worth does not), a contribution one stage's
gradient, a command 16 KiB.

The stage peer is wired as a replica wires it (`LinkAdapter` limits from `frame_limits`, then `StagePeer.start`) over
our real `Transport`, whose streams come from a stand-in for hivemind's P2P: no process, the framing code unchanged."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from peer.daemon.loopback import LoopbackNetwork
from peer.replica.stage_peer import StagePeer
from peer.runner.replica_sync import flat_limits
from peer.runner.stage import StageRunner
from protocol.boundary_sig import seal
from protocol.codecs import WirePacker
from protocol.control import Command, Contribution, encode_command, encode_contribution
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION, KIND_CONTROL, KIND_REDUCE, Header, encode_activation
from swarm.net.framing import LENGTH, REPLY_HEADER
from swarm.net.message_link import LinkAdapter
from swarm.net.transport import Transport
from swarm.replicas.replica import frame_limits

SPEC = preset("tiny", stages=3, codec="subspace")


@pytest.fixture(scope="module")
def runner() -> StageRunner:
    """A middle stage (it serves every kind): built once, read only."""
    return StageRunner(SPEC, 1)


class StreamsOnly:
    """hivemind's P2P as far as a serving Transport uses it: the stream handler of each protocol."""

    def __init__(self) -> None:
        self.handlers: dict[str, object] = {}

    async def add_binary_stream_handler(self, proto: str, handler) -> None:
        self.handlers[proto] = handler

    async def remove_binary_stream_handler(self, proto: str) -> None:
        self.handlers.pop(proto, None)


class Writer:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, b: bytes) -> None:
        self.data += b

    async def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


async def exchange(p2p: StreamsOnly, transport: Transport, kind: str, length: int, body: bytes) -> str:
    """The server's reply text to a request frame whose length field says `length`, followed by `body`."""
    reader = asyncio.StreamReader()
    reader.feed_data(LENGTH.pack(length) + body)
    reader.feed_eof()
    writer = Writer()
    info = SimpleNamespace(peer_id=SimpleNamespace(to_base58=lambda: "sender"))
    await p2p.handlers[transport.protocol_id(kind)](info, reader, writer)
    _, n = REPLY_HEADER.unpack_from(writer.data)
    return bytes(writer.data[REPLY_HEADER.size:REPLY_HEADER.size + n]).decode("utf-8", "replace")


async def test_each_kind_refuses_a_frame_one_byte_over_its_limit_and_reads_one_at_it(runner):
    limits = frame_limits(SPEC, runner)
    p2p = StreamsOnly()
    transport = Transport(p2p, "subspace", max_frame_bytes=256 << 20)
    link = LinkAdapter(transport, "me")
    link.limits.update(limits)  # as `Replica` does before it starts its stage peer
    peer = StagePeer(runner, link, LoopbackNetwork().directory("me"))
    await peer.start()
    try:
        served = set(transport._handlers)
        assert served == set(limits), (served, set(limits))  # a middle stage of a subspace run serves every kind
        reached: list[tuple[str, int]] = []

        def recorder(kind: str):
            async def handler(body: bytes, sender: str) -> bytes:
                reached.append((kind, len(body)))
                return b""
            return handler
        for kind in served:  # what gets past the frame check, instead of the stage's own handlers
            transport._handlers[kind] = recorder(kind)
        for kind, limit in sorted(limits.items()):
            over = await exchange(p2p, transport, kind, limit + 1, b"")  # the length field alone: nothing follows
            assert over == f"frame of {limit + 1} bytes is over the limit of {limit}.", (kind, over)
            assert not reached, (kind, reached)
            await exchange(p2p, transport, kind, limit, bytes(limit))
            assert reached == [(kind, limit)], (kind, reached)
            reached.clear()
    finally:
        await peer.stop()


def test_the_limits_are_one_microbatch_one_stage_gradient_and_16_kib_for_a_command(runner):
    limits = frame_limits(SPEC, runner)
    B, T, w = SPEC.microbatch_size, SPEC.seq_len, SPEC.boundary_width
    packer = WirePacker.for_spec(SPEC)

    def activation(rows: int) -> bytes:  # signed as a sender signs it (a 64-byte Ed25519 signature)
        h = Header(SPEC.run_hash, 2**40, 2**30, 0, SPEC.codec, 1, 2**30)
        body = encode_activation(h, torch.randint(0, SPEC.vocab, (rows, T + 1)), packer.pack(torch.randn(rows, T, w)),
                                 SPEC.vocab)
        return seal(bytes(64), body)
    assert len(activation(B)) <= limits[KIND_ACTIVATION] < len(activation(2 * B))
    gradient = Contribution(SPEC.run_hash, 2**40, 2**30, 1, list(range(SPEC.n_microbatches)),
                            torch.randn(runner.layout.numel, dtype=runner.dtype),
                            stat=None if runner.stat is None else torch.randn(SPEC.d_model, SPEC.rank))
    assert len(encode_contribution(gradient)) <= limits[KIND_REDUCE] == flat_limits(SPEC, runner).max_bytes
    doubled = Contribution(SPEC.run_hash, 0, 0, 1, [0], torch.randn(2 * runner.layout.numel, dtype=runner.dtype))
    assert len(encode_contribution(doubled)) > limits[KIND_REDUCE]
    assert limits[KIND_CONTROL] == 16 << 10
    command = Command(SPEC.run_hash, 2**40, 2**30, "reduce", [f"12D3KooW{i:044d}" for i in range(64)])
    assert len(encode_command(command)) <= limits[KIND_CONTROL]  # a reduce naming 64 replicas fits
