"""What a peer holds of what others send it (docs/security.md, Sizes): a contribution only for the step in progress,
never for an attempt older than this replica's, at most one per replica (and reduce phase), and none of a replica
older than one it already holds; a joiner at most `MAX_QUEUED` (64) forwarded gradients, from its donor only.
Every message goes through the peer's own handlers (decoded as off the wire), over the in-memory loopback."""
from __future__ import annotations

import torch

from peer.daemon.loopback import LoopbackNetwork
from peer.replica.memory_swarm import MemorySwarm
from peer.state.state_transfer import MAX_QUEUED
from protocol.control import Contribution, encode_contribution
from protocol.state_wire import FollowUpdate, encode_follow
from protocol.wire import KIND_FOLLOW, KIND_REDUCE, ErrorReply, WireLimits, decode_message
from tests.peer.test_spot_checks import spec_for

ME, DONOR = "s1r0", "s1donor"


async def one_replica():
    swarm = MemorySwarm(spec_for(2), LoopbackNetwork())
    return swarm, await swarm.add(1, ME)


def outcome(reply: bytes, spec) -> str:
    """"ok", or the refusal's code."""
    if reply == b"":
        return "ok"
    msg = decode_message(reply, WireLimits.for_spec(spec))
    assert isinstance(msg, ErrorReply), msg
    return msg.code


async def test_contributions_of_older_attempts_and_second_ones_of_a_replica_are_not_held():
    swarm, peer = await one_replica()
    spec, runner, inbox = swarm.spec, peer.runner, peer.commit.exchange._inbox
    handler = swarm.net.handlers[(ME, KIND_REDUCE)]

    async def send(sender: str, attempt: int) -> str:
        c = Contribution(spec.run_hash, runner.step, attempt, 1, [0], torch.zeros(runner.layout.numel,
                                                                                 dtype=runner.dtype))
        return outcome(await handler(encode_contribution(c), sender), spec)

    def held() -> dict[str, list[int]]:
        """sender -> the attempts of its contributions held here."""
        by: dict[str, list[int]] = {}
        for (_, attempt, _), box in sorted(inbox.items()):
            for sender in box:
                by.setdefault(sender, []).append(attempt)
        return by
    try:
        await peer.daemon.adopt_attempt(2)
        assert [await send("a", 0), await send("a", 1)] == ["stale", "stale"]  # older than this replica's attempt
        assert held() == {}
        assert [await send("a", 2), await send("a", 2)] == ["ok", "duplicate"]  # a second one of the same replica
        assert await send("b", 2) == "ok"
        assert held() == {"a": [2], "b": [2]}
        assert await send("a", 9) == "ok"  # a newer attempt: every older one's contributions are dropped
        assert held() == {"a": [9]}
        # older attempts again, newest first (each one newer than all but the one held): a replica's older
        # contribution is not held beside its newer one, so it cannot make this replica hold one per attempt
        assert [await send("a", attempt) for attempt in range(8, 1, -1)] == ["stale"] * 7
        assert held() == {"a": [9]}
        assert await send("b", 9) == "ok" and held() == {"a": [9], "b": [9]}
    finally:
        await swarm.stop()


async def test_a_joiner_queues_at_most_64_forwarded_gradients_and_only_from_its_donor():
    swarm, peer = await one_replica()
    spec, runner, follower = swarm.spec, peer.runner, peer.follower
    handler = swarm.net.handlers[(ME, KIND_FOLLOW)]
    follower.donor = DONOR  # as a join from DONOR sets it; not active: nothing is applied, all is queued
    grads = torch.zeros(runner.n_params, dtype=runner.dtype)
    try:
        body = encode_follow(FollowUpdate(spec.run_hash, 0, grads))
        assert outcome(await handler(body, "stranger"), spec) == "refused"  # not its donor
        assert follower.queue == {}
        for step in range(MAX_QUEUED + 1):  # a 65th, for the step after the 64 queued
            body = encode_follow(FollowUpdate(spec.run_hash, step, grads))
            assert outcome(await handler(body, DONOR), spec) == "ok"
        assert MAX_QUEUED == 64 and sorted(follower.queue) == list(range(64))  # the 65th is not held
    finally:
        await swarm.stop()
