"""Signed boundary messages (issue 57, item 1; protocol/boundary_sig.py): a receiver takes an activation or
a gradient only with its sender's signature of that message to this receiver, so it cannot claim to have
received what was never sent (the leader's side: tests/peer/test_head_checks.py)."""
from __future__ import annotations

import torch

from peer.daemon.delivery import ACK
from protocol.boundary_sig import MAX_SIGNATURE, seal, statement, unseal
from protocol.codecs import WirePacker
from protocol.spot_check import digest
from protocol.wire import KIND_ACTIVATION, ErrorReply, Header, decode_message, encode_activation
from tests.peer.swarm_in_memory import make_swarm
from tests.peer.test_spot_checks import spec_for


def test_a_frame_carries_its_signature_in_front_and_an_unsigned_body_is_told_apart():
    body = b"\x8a" + bytes(100)  # a msgpack map's first byte: never the frame's mark
    assert unseal(seal(b"s" * 64, body)) == (b"s" * 64, body)
    assert unseal(body) == (b"", body) and seal(b"", body) == body
    assert unseal(seal(b"s" * MAX_SIGNATURE, body)) == (b"s" * MAX_SIGNATURE, body)
    # the statement names everything a receiver or the leader checks it against
    base = ("run", 3, 1, 5, "act", "peer", bytes(16))
    for i, other in enumerate(("run2", 4, 2, 6, "grad", "peer2", b"\x01" * 16)):
        assert statement(*base[:i], other, *base[i + 1:]) != statement(*base)


async def test_a_receiver_takes_an_activation_only_with_its_senders_signature_for_it():
    spec = spec_for(2)
    swarm = await make_swarm(spec, [1, 1])
    try:
        head, tail = swarm.peers["s0r0"], swarm.peers["s1r0"]
        h = Header(spec.run_hash, 0, 0, head.runner.version_for_step(0), spec.codec, 1, 0)
        tokens = torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1))
        z = WirePacker.for_spec(spec).pack(0.1 * torch.randn(spec.microbatch_size, spec.seq_len, spec.boundary_width,
                                                             dtype=torch.float64))
        body = encode_activation(h, tokens, z, spec.vocab)
        handler = swarm.net.handlers[(tail.peer_id, KIND_ACTIVATION)]

        def signed(by: str, to: str, data: bytes = body) -> bytes:
            said = statement(spec.run_hash, 0, 0, 0, KIND_ACTIVATION, to, digest(data))
            return seal(swarm.net.keys.signer(by).sign(said), body)

        def refusal(reply: bytes) -> str:
            msg = decode_message(reply, tail.daemon._limits())
            assert isinstance(msg, ErrorReply), reply
            return msg.reason
        assert "not signed by its sender" in refusal(await handler(body, head.peer_id))  # unsigned
        assert "not signed" in refusal(await handler(signed(head.peer_id, "s1r9"), head.peer_id))  # for another
        assert "not signed" in refusal(await handler(signed("stranger", tail.peer_id), head.peer_id))  # another key
        assert "not signed" in refusal(await handler(signed(head.peer_id, tail.peer_id, body + b"x"), head.peer_id))
        assert tail.daemon.boundary.sent(0, 0) == []  # nothing refused was taken, nor reported
        assert await handler(signed(head.peer_id, tail.peer_id), head.peer_id) == ACK
        (got,) = tail.daemon.boundary.sent(0, 0)  # reported with the sender's signature: its evidence
        assert (got.kind, got.to, got.digest) == ("r", head.peer_id, digest(body))
        assert swarm.net.keys.signer(tail.peer_id).verify(
            head.peer_id, statement(spec.run_hash, 0, 0, 0, KIND_ACTIVATION, tail.peer_id, got.digest), got.sig)
    finally:
        await swarm.stop()
