"""Spot checks' records and messages (protocol/spot_check.py): round trips, and what is refused."""
from __future__ import annotations

import msgpack
import pytest
import torch

from protocol.control import CommandReply, FlatLimits, decode_reduce, decode_reply, encode_reply
from protocol.spot_check import (
    CheckOrder,
    InputsRequest,
    Sent,
    decode_inputs_reply,
    decode_order,
    digest,
    encode_inputs_reply,
    encode_inputs_request,
    encode_order,
)
from protocol.wire import WireError

D1, D2 = digest(b"activation"), digest(b"gradient")
LIM = FlatLimits("run", 1, 10, torch.float32, None, 4)


def test_digest_is_16_bytes_of_sha256_of_the_bytes_as_sent():
    assert len(D1) == 16 and D1 != D2 and digest(b"activation") == D1


def test_a_check_order_round_trips():
    order = CheckOrder("peer-a", [1, 3], [(D1, D2), (D2, None)])
    assert decode_order(encode_order(order), 4) == order


@pytest.mark.parametrize("body,why", [
    ({"t": "p", "m": [], "i": []}, "at least one"),
    ({"t": "p", "m": [1], "i": [[b"short", None]]}, "16 bytes"),
    ({"t": "p", "m": [1, 2], "i": [[D1, None]]}, "one \\[activation, gradient\\] digest pair"),
    ({"t": "p", "m": [7], "i": [[D1, None]]}, "microbatches"),
    ({"t": 5, "m": [1], "i": [[D1, None]]}, "peer id"),
])
def test_malformed_check_orders_are_refused(body, why):
    with pytest.raises(WireError, match=why):
        decode_order(msgpack.packb(body), 4)


def test_sent_records_travel_in_a_reduce_reply_and_are_validated():
    reply = CommandReply(2, 0, "ok", [0], {}, sent=[Sent("a", 0, "peer-b", D1), Sent("g", 3, "peer-c", D2)],
                         blame=["peer-x"])
    back = decode_reply(encode_reply(reply), 4)
    assert back.sent == reply.sent and back.blame == ["peer-x"]
    bad = msgpack.unpackb(encode_reply(reply))
    bad["n"][0][0] = "z"  # neither an activation nor a gradient
    with pytest.raises(WireError, match="sent entry"):
        decode_reply(msgpack.packb(bad), 4)


def test_an_inputs_request_comes_over_red_and_its_reply_is_checked():
    req = InputsRequest("run", 5, 1, 1, [0, 2])
    assert decode_reduce(encode_inputs_request(req), LIM) == req
    with pytest.raises(WireError, match="not for stage 1"):
        decode_reduce(encode_inputs_request(InputsRequest("run", 5, 1, 2, [0])), LIM)
    bodies = [(b"a0", b"g0"), (b"a2", None)]
    assert decode_inputs_reply(encode_inputs_reply(bodies), 2, 1 << 20) == bodies
    with pytest.raises(WireError, match="2 \\[activation, gradient\\] body pairs"):
        decode_inputs_reply(encode_inputs_reply(bodies[:1]), 2, 1 << 20)
    with pytest.raises(WireError, match="not valid msgpack"):
        decode_inputs_reply(encode_inputs_reply([(b"x" * 100, None), (b"y", None)]), 2, 10)  # a body over the limit
