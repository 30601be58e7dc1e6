"""Identities that cost, over real libp2p (issue 20 item 4): a coordinator whose run asks a proof of work of every
peer id, an honest `swarm peer` that pays it, and a stranger's bare hivemind node (no validator) that stores 40
announcements for fake ids without proofs, and 40 with proofs paid at the run's (tiny, for speed) cost.

Every honest node that holds the run's rule refuses the 40 unproven ones (no node stores them), every reader
skips them (also a reader over the stranger's own node, which serves them), and the 40 proven ones cost the
stranger 40 times what one id costs, counted in hashes."""
from __future__ import annotations

import asyncio
import warnings

from protocol.spec import RunSpec
from swarm.dht import Envelope, StageAnnouncement, SwarmDHT, stage_key
from swarm.trust.identity import Identity
from swarm.trust.work import find_proof
from tests.e2e.test_attacks_records import (
    attacker_node,
    eventually,
    honest_nodes_store,
    honest_reader,
    serve_from_attacker,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.utils import get_dht_time

BITS = 12  # 4096 hashes an id (about 2.5 ms here): the rule is the same at the default 22, the bill 1024x
FAKES = 40


async def test_forty_fake_ids_without_proofs_are_refused_and_paying_costs_forty_times_one(make_swarm, tmp_path):
    swarm = make_swarm(stages=2)
    maddrs = await asyncio.to_thread(swarm.start_coordinator, "--id-work-bits", str(BITS), serving=False)
    # direct: no dial-back check, which only costs time here
    swarm.start_peer(1, "--identity", str(tmp_path / "honest.id"), "--reachability", "direct")

    async def adopted() -> bool:  # the peer computes its proof once it holds the run's rule (SwarmDHT.adopt):
        log = swarm.dir / "stage1.log"  # before that its node knows no rule to refuse by (swarm/dht/validator.py)
        return log.exists() and "computing this peer's proof of work" in log.read_text()
    await eventually(adopted, timeout=90.0, what="the honest peer adopting the run's rule")

    async with honest_reader(maddrs) as reader, attacker_node(maddrs) as attacker:
        spec = RunSpec.from_json((await reader.fetch_run_spec()).spec_json)
        assert spec.extra["id_work_bits"] == BITS
        await reader.adopt(spec)
        run, key = spec.run_hash, stage_key(spec.run_hash, 1)

        def record(who: Identity, nonce: int | None) -> tuple[dict, float]:
            ann = StageAnnouncement(who.peer_id, run, 1, ["/ip4/127.0.0.1/tcp/9"], 1e12, 0, 0, "online", "0.1.0")
            expiry = get_dht_time() + 30
            return Envelope.seal(key, who.peer_id, ann.to_record(), expiry, who, work=nonce).to_value(), expiry

        unproven = [Identity.generate() for _ in range(FAKES)]
        stored = await asyncio.gather(*(honest_nodes_store(attacker, key, w.peer_id, *record(w, None))
                                        for w in unproven))
        assert not any(stored), f"{sum(stored)} unproven announcements were stored by an honest node"
        # another run's proof, or another id's, is no proof either
        stolen = find_proof("0" * 16, unproven[0].peer_id, BITS)[0]
        assert not await honest_nodes_store(attacker, key, unproven[0].peer_id, *record(unproven[0], stolen))
        # the stranger's own node serves them to every lookup
        await asyncio.gather(*(serve_from_attacker(attacker, key, w.peer_id, *record(w, None)) for w in unproven))

        paying = [Identity.generate() for _ in range(FAKES)]
        proofs = [find_proof(run, w.peer_id, BITS) for w in paying]
        hashes = sum(h for _, h in proofs)
        # 40 ids cost 40 times one (2^BITS hashes each on average; the sum of 40 draws is within +-50 % of it)
        assert 0.5 * FAKES * 2 ** BITS < hashes < 1.5 * FAKES * 2 ** BITS, hashes
        stored = await asyncio.gather(*(honest_nodes_store(attacker, key, w.peer_id, *record(w, nonce))
                                        for w, (nonce, _) in zip(paying, proofs)))
        assert sum(stored) == FAKES, "a paid-for id is accepted: a public swarm stays open"

        unproven_ids, paying_ids = {w.peer_id for w in unproven}, {w.peer_id for w in paying}

        async def the_honest_peer() -> list[str]:  # announced, with the proof it paid for
            return [a.peer_id for a in await reader.stage_peers(run, 1) if a.peer_id not in paying_ids]
        honest = (await eventually(the_honest_peer, timeout=90.0, what="the honest peer's announcement"))[0]
        log = (swarm.dir / "stage1.log").read_text()
        assert "computing this peer's proof of work" in log and "proof of work found after" in log
        assert (tmp_path / "honest.id.work.json").exists(), "kept beside the identity, for the next start"
        exposed = SwarmDHT(attacker)  # a reader whose own node keeps everything (the stranger's)
        await exposed.adopt(spec)
        for a_reader in (reader, exposed):
            seen = {a.peer_id for a in await a_reader.stage_peers(run, 1)}
            assert not seen & unproven_ids, f"{len(seen & unproven_ids)} unproven ids read"
        assert exposed.skipped_records >= FAKES
        everyone = {honest, *paying_ids}  # the honest peer, and the ids that were paid for

        async def all_paid_for() -> bool:
            return {a.peer_id for a in await reader.stage_peers(run, 1)} == everyone
        await eventually(all_paid_for, what="the honest peer and the 40 paid-for ids, and no other")
