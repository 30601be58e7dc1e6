"""A coordinator that restarts, or a standby that takes over with the same swarm key, resumes its duties from
the DHT (issue 56, item 3): `BasisRefitter.resume()` takes up the signed chain of basis updates (the next
re-fit is version V+1 from U_V, the same bits as a coordinator that never stopped) and
`SnapshotVouch.resume()` the vouched snapshot and state hashes (its next record keeps the earlier steps).
The DHT is an in-memory fake here, and the real one (two nodes, stopped by the fixture) in the e2e test."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
import torch

from protocol.basis_update import BasisUpdate, StatsMessage, canonical_basis, encode_stats, encode_update
from protocol.model import compute_dtype
from protocol.spec import preset
from protocol.step_record import WorkRecord
from swarm.basis.refit import BasisRefitter
from swarm.replicas.vouched import SnapshotVouch, vouched_hashes
from swarm.trust.keys import SigningKey
from tests.swarm.test_dht import eventually, swarm  # noqa: F401  (the fixture: two real DHT nodes)
from tests.swarm.test_leases import swarm_key_views
from tests.swarm.test_refit_trust import FakeDHT, FakeTransport, _settle, refused, stat
from tests.swarm.test_vouched import RUN, Stored, record, sha, states

KEY = SigningKey.generate()
SPEC = preset("tiny", stages=3, basis_interval=5).replace(coordinator_key=KEY.public_bytes().hex())


@dataclass
class BasisStore(FakeDHT):
    """The refit fake, keeping each version's update bytes as the DHT does (one entry per version: a newer one
    of the same version replaces it)."""
    bodies: dict[int, bytes] = field(default_factory=dict)

    async def publish_basis(self, run_hash: str, version: int, body: bytes, ttl: float) -> bool:
        self.bodies[version] = body
        return await super().publish_basis(run_hash, version, body, ttl)

    async def fetch_bases(self, run_hash: str, coordinator_key: bytes | None = None) -> dict[int, bytes]:
        assert coordinator_key == KEY.public_bytes()
        return dict(self.bodies)


def body(stage: int, step: int, M: torch.Tensor, version: int) -> bytes:
    return encode_stats(StatsMessage(SPEC.run_hash, stage, version, step, M))


def peers() -> dict[int, list[str]]:
    return {1: ["a1"], 2: ["a2"]}


def refitter(dht: FakeDHT, key: SigningKey = KEY) -> BasisRefitter:
    return BasisRefitter(SPEC, key, dht, FakeTransport(), ttl=60)


async def refit(r: BasisRefitter, step: int, version: int) -> None:
    for stage in (1, 2):
        assert await r.on_stats(body(stage, step, stat(100 * step + stage), version), f"a{stage}") == b""
    await _settle()
    assert r.published[-1].version == version + 1


def signed(version: int, effective: int, U: torch.Tensor, key: SigningKey = KEY) -> bytes:
    update = BasisUpdate(SPEC.run_hash, version, effective, U)
    update.signature = key.sign(update.signing_bytes())
    return encode_update(update)


async def test_a_restarted_refitter_resumes_the_chain_and_signs_the_same_next_version_as_one_that_never_stopped():
    whole = refitter(BasisStore(peers(), step=15))  # never stops
    for step, version in ((5, 0), (10, 1), (15, 2)):
        await refit(whole, step, version)
    dht = BasisStore(peers(), step=15)
    first = refitter(dht)
    await refit(first, 5, 0)
    await refit(first, 10, 1)
    standby = refitter(dht)  # the same swarm key, nothing in memory
    assert "version 2 is unknown" in refused(await standby.on_stats(body(1, 15, stat(1), 2), "a1"))
    assert await standby.resume() == 2
    assert sorted(standby.bases) == [0, 1, 2] and standby.last_refit == 10
    assert all(torch.equal(standby.bases[v], first.bases[v]) for v in (0, 1, 2))
    assert [encode_update(u) for u in standby.published] == [encode_update(u) for u in first.published]
    assert "not for a re-fit step being collected" in refused(await standby.on_stats(body(1, 10, stat(1), 1), "a1"))
    dht.published.clear()
    await standby.republish()  # late joiners find the whole chain
    assert dht.published == [1, 2]
    await refit(standby, 15, 2)  # a statistic tagged version 2 is taken, and the re-fit steps from U_2
    got, want = standby.published[-1], whole.published[-1]
    assert (got.version, got.effective_step) == (3, 15 + SPEC.basis_switch_delay) == (want.version, want.effective_step)
    assert torch.equal(got.U, want.U) and encode_update(got) == encode_update(want)  # the same bits, signed alike
    assert torch.equal(standby.bases[3], whole.bases[3])


async def test_resume_skips_what_the_coordinator_key_did_not_sign_and_stops_at_the_first_gap(caplog):
    dht = BasisStore(peers(), step=15)
    first = refitter(dht)
    await refit(first, 5, 0)
    await refit(first, 10, 1)
    U = first.published[-1].U
    dht.bodies[3] = signed(3, 30, U, SigningKey.generate())  # a forger's update: skipped, and the chain ends at 2
    dht.bodies[4] = signed(4, 40, U)  # the coordinator's, but after the gap
    dht.bodies[0] = b"garbage"
    with caplog.at_level(logging.WARNING):
        standby = refitter(dht)
        assert await standby.resume() == 2
    assert "skipped the stored basis update 3" in caplog.text and "stops at version 2" in caplog.text
    assert sorted(standby.bases) == [0, 1, 2] and [u.version for u in standby.published] == [1, 2]
    dht.bodies = {2: dht.bodies[2]}  # version 1 gone: nothing to chain from
    assert await refitter(dht).resume() == 0
    dht.bodies = {}
    empty = refitter(dht)
    assert await empty.resume() == 0 and sorted(empty.bases) == [0] and empty.last_refit == 0


async def test_an_abandoned_version_left_in_the_dht_is_neither_republished_nor_resumed():
    dht = BasisStore(peers(), step=20)
    first = refitter(dht)
    await refit(first, 5, 0)
    await refit(first, 10, 1)
    await refit(first, 15, 2)  # version 3: the stages never take it up, they are on version 1 still
    old3 = dht.bodies[3]
    await refit(first, 20, 1)  # a new version 2 from U_1; the old version 3 stays in the DHT until its ttl
    assert dht.bodies[3] == old3 and [u.version for u in first.published] == [1, 2]
    dht.published.clear()
    await first.republish()
    assert dht.published == [1, 2]
    standby = refitter(dht)
    assert await standby.resume() == 2 and standby.last_refit == 20  # old 3 is effective before the new 2
    assert torch.equal(standby.bases[2], canonical_basis(first.published[-1].U, compute_dtype(SPEC)))
    assert torch.equal(standby.bases[2], first.bases[2])


class VouchStore(Stored):
    """test_vouched's fake, read back as the DHT does: the newest record of each kind."""

    async def fetch_vouched(self, run_hash: str, states: bool = False):
        found = self.states if states else self.records
        return found[-1] if found else None


async def test_a_restarted_vouch_keeps_the_earlier_steps_in_its_next_record_and_resumed_steps_are_no_target():
    dht = VouchStore()
    first = SnapshotVouch(dht, RUN, n_stages=2, keep=3)
    for step in (50, 100, 150):
        assert await first.take(record(step, {0: sha(step), 1: sha(step + 1)}))
    for step in (4, 8):
        assert await first.take_states(states(step, {0: sha(step), 1: sha(step + 1)}))
    standby = SnapshotVouch(dht, RUN, n_stages=2, keep=3)
    await standby.resume()
    assert standby.vouched.steps == first.vouched.steps and standby.states.steps == first.states.steps
    assert await standby.take(WorkRecord(RUN, 201, "new head", {}, snapshot_step=200,
                                         snapshots={0: sha(200), 1: sha(201)}))
    assert sorted(dht.records[-1].steps) == [100, 150, 200] and dht.records[-1].steps[100] == {0: sha(100),
                                                                                               1: sha(101)}
    assert not await standby.take_states(states(8, {0: sha(9)}))  # not newer than the resumed steps
    assert await standby.take_states(states(12, {0: sha(12)}))
    assert sorted(dht.states[-1].steps) == [4, 8, 12]
    # the head of a resumed step is unknown (it may be the caught one): only steps seen since are targets
    assert standby.before("leader", 300, []) == 200
    assert standby.before("new head", 300, []) is None and standby.before("leader", 199, []) is None
    assert first.before("new head", 300, []) == 150  # the process that saw the records knows their head


async def test_a_vouch_resumes_nothing_from_an_empty_dht_and_only_its_newest_steps_from_a_longer_record():
    dht = VouchStore()
    fresh = SnapshotVouch(dht, RUN, n_stages=2)
    await fresh.resume()
    assert fresh.vouched.steps == {} and fresh.states.steps == {}
    first = SnapshotVouch(dht, RUN, n_stages=2, keep=4)
    for step in (10, 20, 30, 40):
        assert await first.take(record(step, {0: sha(step), 1: sha(step + 1)}))
    smaller = SnapshotVouch(dht, RUN, n_stages=2, keep=2)
    await smaller.resume()
    assert sorted(smaller.vouched.steps) == [30, 40]


@pytest.mark.e2e
async def test_a_standby_coordinator_resumes_basis_updates_and_vouched_snapshots_over_a_real_dht(swarm):  # noqa: F811
    coordinator, _, reader = swarm_key_views(swarm)
    key = coordinator.swarm_key
    spec = preset("tiny", stages=3, basis_interval=5).replace(coordinator_key=key.public_bytes().hex())
    U = torch.linalg.qr(torch.randn(spec.d_model, spec.rank, dtype=torch.float64))[0].float()
    for version in (1, 2):
        update = BasisUpdate(spec.run_hash, version, 5 * version + spec.basis_switch_delay, U)
        update.signature = key.sign(update.signing_bytes())
        assert await coordinator.publish_basis(spec.run_hash, version, encode_update(update), 60)
    standby = BasisRefitter(spec, key, coordinator, FakeTransport(), ttl=60)
    assert await standby.resume() == 2 and standby.last_refit == 10 and sorted(standby.bases) == [0, 1, 2]
    assert await SnapshotVouch(coordinator, RUN, n_stages=2).take(record(50, {0: sha(1), 1: sha(2)}))
    vouch = SnapshotVouch(coordinator, RUN, n_stages=2)
    await vouch.resume()
    assert await vouch.take(record(100, {0: sha(3), 1: sha(4)}))
    assert await eventually(lambda: _both(reader)) == {50: sha(2), 100: sha(4)}  # the record travels to the reader


async def _both(reader) -> dict[int, str] | None:
    found = await vouched_hashes(reader, RUN, 1)
    return found if len(found) == 2 else None
