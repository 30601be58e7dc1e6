"""The coordinator's trust in re-fit statistics (BasisRefitter.on_stats), with the DHT and the
transport replaced by fakes: statistics only from peers announced for their stage, only for
re-fit steps in the window, at most one held per peer, and a basis is re-fitted only from a
statistic a majority of each stage's live replicas agree on."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import torch

from protocol.basis_update import StatsMessage, encode_stats
from protocol.spec import preset
from protocol.wire import ErrorReply, WireLimits, decode_message
from swarm.basis.refit import BasisRefitter
from swarm.dht import StageAnnouncement
from swarm.trust.keys import SigningKey

SPEC = preset("tiny", stages=3, basis_interval=5)


@dataclass
class FakeDHT:
    peers: dict[int, list[str]]  # stage -> live peer ids
    step: int = 5
    published: list[int] = field(default_factory=list)

    async def stage_peers(self, run_hash: str, stage: int) -> list[StageAnnouncement]:
        return [StageAnnouncement(p, run_hash, stage, [], 1.0, 0, 0, "online", "test", step=self.step)
                for p in self.peers.get(stage, [])]

    async def all_stage_peers(self, run_hash: str, n_stages: int):
        return {s: await self.stage_peers(run_hash, s) for s in range(n_stages)}

    async def publish_basis(self, run_hash: str, version: int, body: bytes, ttl: float) -> bool:
        self.published.append(version)
        return True


class FakeTransport:
    async def request(self, peer, kind, body, timeout=None) -> bytes:
        return b""


def stat(seed: int) -> torch.Tensor:
    return torch.randn(SPEC.d_model, SPEC.rank, generator=torch.Generator().manual_seed(seed))


def body(stage: int, step: int, M: torch.Tensor, version: int = 0) -> bytes:
    return encode_stats(StatsMessage(SPEC.run_hash, stage, version, step, M))


def refused(reply: bytes) -> str:
    msg = decode_message(reply, WireLimits.for_spec(SPEC))
    assert isinstance(msg, ErrorReply), "accepted"
    return msg.reason


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)  # let the re-fit task the refitter started run


async def test_statistics_from_strangers_or_out_of_window_are_refused_and_hold_no_memory():
    dht = FakeDHT({1: ["a1"], 2: ["a2"]})
    r = BasisRefitter(SPEC, SigningKey.generate(), dht, FakeTransport(), ttl=60)
    assert "only peers announced for stage 1" in refused(await r.on_stats(body(1, 5, stat(0)), "stranger"))
    assert "only peers announced for stage 1" in refused(await r.on_stats(body(1, 5, stat(0)), "a2"))
    assert "not for a re-fit step" in refused(await r.on_stats(body(1, 7, stat(0)), "a1"))
    assert "re-fit step being collected" in refused(await r.on_stats(body(1, 10**9, stat(0)), "a1"))
    assert r._stats == {} and r._pending == {}
    assert await r.on_stats(body(1, 5, stat(0)), "a1") == b""
    assert "already here" in refused(await r.on_stats(body(1, 5, stat(0)), "a1"))
    assert await r.on_stats(body(1, 10, stat(1)), "a1") == b""  # a newer statistic replaces its older one
    assert sum(len(peers) for by_stage in r._stats.values() for peers in by_stage.values()) == 1
    assert dht.published == []


async def test_a_basis_is_refitted_only_from_a_majority_of_each_stages_replicas():
    dht = FakeDHT({1: ["a1", "b1", "evil"], 2: ["a2"]})
    r = BasisRefitter(SPEC, SigningKey.generate(), dht, FakeTransport(), ttl=60)
    honest1, honest2, poison = stat(1), stat(2), stat(99) * 1e3
    assert await r.on_stats(body(1, 5, poison), "evil") == b""  # first to arrive: counts for nothing alone
    assert await r.on_stats(body(2, 5, honest2), "a2") == b""
    assert await r.on_stats(body(1, 5, honest1), "a1") == b""
    await _settle()
    assert dht.published == [], "a re-fit from 1 of 3 replicas, or from the first arrival"
    assert await r.on_stats(body(1, 5, honest1), "b1") == b""  # 2 of 3 agree
    await _settle()
    assert dht.published == [1] and r.dropped == 1  # the poisoned statistic: left out, and logged
    want = BasisRefitter(SPEC, SigningKey.generate(), FakeDHT({1: ["x"], 2: ["y"]}), FakeTransport(), ttl=60)
    await want.on_stats(body(1, 5, honest1), "x")
    await want.on_stats(body(2, 5, honest2), "y")
    await _settle()
    assert torch.equal(r.published[0].U, want.published[0].U), "the re-fit did not use the honest statistic"
    assert r.published[0].effective_step == 5 + SPEC.basis_switch_delay


async def test_replicas_whose_statistics_differ_in_the_last_bits_still_agree_and_a_lie_does_not():
    dht = FakeDHT({1: ["a1", "b1", "evil"], 2: ["a2"]})
    r = BasisRefitter(SPEC, SigningKey.generate(), dht, FakeTransport(), ttl=60)
    honest = stat(1)  # statistics travel as float32
    rounded = honest.clone()  # a replica that joined by download: the same sum, another last bit
    rounded[0, :3] = torch.nextafter(rounded[0, :3], torch.full((3,), float("inf")))
    assert not torch.equal(honest, rounded)
    assert await r.on_stats(body(1, 5, honest * (1 + 1e-3)), "evil") == b""  # close, but not within 1e-6
    assert await r.on_stats(body(2, 5, stat(2)), "a2") == b""
    assert await r.on_stats(body(1, 5, rounded), "b1") == b""
    await _settle()
    assert dht.published == [], "2 different statistics of 3 replicas are no majority"
    assert await r.on_stats(body(1, 5, honest), "a1") == b""
    await _settle()
    assert dht.published == [1]
    want = BasisRefitter(SPEC, SigningKey.generate(), FakeDHT({1: ["x"], 2: ["y"]}), FakeTransport(), ttl=60)
    await want.on_stats(body(1, 5, honest), "x")  # a1's: the lowest id of the agreeing replicas
    await want.on_stats(body(2, 5, stat(2)), "y")
    await _settle()
    assert torch.equal(r.published[0].U, want.published[0].U)


async def test_a_replica_that_died_after_the_others_sent_their_statistic_does_not_lose_the_re_fit():
    dht = FakeDHT({1: ["a1", "dead"], 2: ["a2"]})  # its record lives on: the DHT still lists it
    alive = {"a1", "a2", "dead"}

    async def answers(peer: str) -> bool:
        return peer in alive
    r = BasisRefitter(SPEC, SigningKey.generate(), dht, FakeTransport(), ttl=60, answers=answers, recheck_s=0.01)
    assert await r.on_stats(body(2, 5, stat(2)), "a2") == b""
    assert await r.on_stats(body(1, 5, stat(1)), "a1") == b""
    await _settle()
    assert dht.published == [], "1 of stage 1's 2 live replicas is no majority"
    alive.discard("dead")  # killed before it sent its statistic: no statistic will come to trigger a look
    deadline = asyncio.get_running_loop().time() + 10
    while not dht.published:
        assert asyncio.get_running_loop().time() < deadline, "the re-fit was lost with the dead replica"
        await asyncio.sleep(0.01)  # poll the refitter's re-check
    assert dht.published == [1] and r.published[0].effective_step == 5 + SPEC.basis_switch_delay
    r.stop()


async def test_with_a_lease_only_the_workers_the_leaders_record_names_vote_and_a_far_announced_step_moves_nothing():
    from protocol.step_record import WorkRecord
    from swarm.trust.identity import Identity
    from swarm.trust.signed_records import sign_record
    leader, stranger = Identity.generate(), Identity.generate()
    fakes1, fakes2 = [f"fake1-{i}" for i in range(4)], [f"fake2-{i}" for i in range(4)]
    dht = FakeDHT({1: ["a1", *fakes1], 2: ["a2", *fakes2]}, step=10**6)  # the fakes announce a far step
    r = BasisRefitter(SPEC, SigningKey.generate(), dht, FakeTransport(), ttl=60, leaders=lambda: [leader.peer_id])
    poison = stat(99) * 1e3
    assert "re-fit step being collected" in refused(await r.on_stats(body(1, 10**6, poison), fakes1[0]))
    for fake in fakes1:
        assert await r.on_stats(body(1, 5, poison), fake) == b""
    for fake in fakes2:
        assert await r.on_stats(body(2, 5, poison), fake) == b""
    assert await r.on_stats(body(1, 5, stat(1)), "a1") == b""
    assert await r.on_stats(body(2, 5, stat(2)), "a2") == b""
    await _settle()
    assert dht.published == [], "8 fake ids of 10 announced replicas got a basis published"

    def work(by: Identity, workers: dict) -> bytes:
        return sign_record(by)(WorkRecord(SPEC.run_hash, 5, by.peer_id, workers)).encode()
    named = {1: ["a1"], 2: ["a2"]}
    assert "lease names" in refused(await r.on_work(work(stranger, {1: fakes1, 2: fakes2}), stranger.peer_id))
    forged = WorkRecord.decode(work(leader, named), SPEC.run_hash, SPEC.n_stages)
    forged = WorkRecord(SPEC.run_hash, 5, leader.peer_id, {1: fakes1, 2: fakes2}, forged.signer, forged.signature)
    assert "not signed" in refused(await r.on_work(forged.encode(), leader.peer_id))
    await _settle()
    assert dht.published == []
    assert await r.on_work(work(leader, named), leader.peer_id) == b""
    await _settle()
    assert dht.published == [1] and r.published[0].effective_step == 5 + SPEC.basis_switch_delay
    want = BasisRefitter(SPEC, SigningKey.generate(), FakeDHT({1: ["x"], 2: ["y"]}), FakeTransport(), ttl=60)
    await want.on_stats(body(1, 5, stat(1)), "x")
    await want.on_stats(body(2, 5, stat(2)), "y")
    await _settle()
    assert torch.equal(r.published[0].U, want.published[0].U), "the re-fit did not use the workers' statistics"


async def test_a_statistic_naming_a_boolean_stage_is_refused_not_taken_for_stage_1():
    import msgpack

    r = BasisRefitter(SPEC, SigningKey.generate(), FakeDHT({1: ["a1"], 2: ["a2"]}), FakeTransport(), ttl=60)
    d = msgpack.unpackb(body(1, 5, stat(0)), raw=False, strict_map_key=False,
                        ext_hook=lambda code, data: msgpack.ExtType(code, data))
    d["g"] = True  # msgpack's true is an int to Python: it must not pass for stage 1
    assert "receiving stages" in refused(await r.on_stats(msgpack.packb(d), "a1"))
