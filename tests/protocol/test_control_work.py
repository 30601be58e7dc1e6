"""The "work" command (issue 22, item 1): a head's share travels as microbatch indices, its reply as
one finite loss per microbatch; anything else is refused on the way in."""
from __future__ import annotations

import math

import msgpack
import pytest

from protocol.control import Command, CommandReply, decode_command, decode_reply, encode_command, encode_reply
from protocol.wire import WireError

RUN = "r" * 16


def test_a_work_command_and_its_reply_round_trip():
    cmd = Command(RUN, 7, 2, "work", ["leader", "other"], microbatches=[5, 1, 3])
    got = decode_command(encode_command(cmd), RUN)
    assert (got.op, got.candidates, got.microbatches, got.step, got.attempt) == ("work", ["leader", "other"],
                                                                                [1, 3, 5], 7, 2)
    reply = CommandReply(7, 2, "ok", [1, 3, 5], losses=[5.25, 4.5, 4.125])
    assert decode_reply(encode_reply(reply), 8).losses == [5.25, 4.5, 4.125]
    assert decode_reply(encode_reply(CommandReply(7, 2, "ok")), 8).losses == []  # left out when empty


@pytest.mark.parametrize("bad", [[math.nan], [math.inf], ["1.0"], [1], [0.5] * 9])
def test_a_reply_with_losses_that_are_not_finite_floats_or_too_many_is_refused(bad):
    body = msgpack.unpackb(encode_reply(CommandReply(7, 2, "ok")))
    with pytest.raises(WireError, match="losses"):
        decode_reply(msgpack.packb({**body, "l": bad}), 8)


@pytest.mark.parametrize("bad", [[-1], [1, 1], ["0"], [True]])
def test_a_work_command_with_bad_microbatch_indices_is_refused(bad):
    body = msgpack.unpackb(encode_command(Command(RUN, 7, 2, "work", ["leader"])))
    with pytest.raises(WireError, match="microbatches"):
        decode_command(msgpack.packb({**body, "m": bad}), RUN)
