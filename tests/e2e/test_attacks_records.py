"""An attacker's DHT node against a live swarm (coordinator + a stage peer, real processes).

The attacker is a bare hivemind node in the test process, without the swarm's validator: it
stores whatever it likes, directly. It tries to replace an honest peer's announcement, lock it
with a far expiry, replace the whole stage key with a plain value, publish a fake run spec, a
fake next basis version and a fake health record. Every honest node must refuse each (the
store is reported as not stored by any of them), an honest reader must still see exactly the
honest records (even though the attacker's own node serves the forgeries), and the honest
peer's next heartbeat must still be stored. In a private swarm, an outsider gets nothing
accepted, and a `swarm peer` without a ticket is refused with one clear message.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import warnings
from contextlib import asynccontextmanager

import pytest

from protocol.spec import RunSpec, preset
from swarm.dht import (
    RUN_KEY,
    Envelope,
    RecordError,
    SignedRunSpec,
    StageAnnouncement,
    SwarmDHT,
    basis_key,
    basis_subkey,
    health_key,
    stage_key,
    start_dht,
    stop_dht,
)
from swarm.local import LocalOptions, LocalSwarm
from swarm.monitor.health import fetch_health, parse_health
from swarm.trust.admission import Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from tests.e2e.conftest import wait_for_event
from tests.swarm.test_health import record

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind
    from hivemind.utils import get_dht_time

LOCAL = ["/ip4/127.0.0.1/tcp/0"]
FAST = 1e12  # tokens/s: what a forged announcement claims, to draw the head's microbatches


async def eventually(check, timeout: float = 30.0, what: str = "the condition"):
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not met within {timeout:g} s (last: {result!r})")
        await asyncio.sleep(0.3)  # poll interval of the DHT


@asynccontextmanager
async def honest_reader(maddrs: list[str]):
    """A DHT client with the swarm's validator, reading as a peer or the dashboard does."""
    dht = await asyncio.to_thread(start_dht, maddrs, LOCAL, None, True)
    try:
        yield SwarmDHT(dht)
    finally:
        await asyncio.to_thread(stop_dht, dht)


@asynccontextmanager
async def attacker_node(maddrs: list[str]):
    """A bare hivemind node (a server: it also stores and serves), with no validator."""
    dht = await asyncio.to_thread(hivemind.DHT, initial_peers=maddrs, host_maddrs=LOCAL, start=True)
    try:
        yield dht
    finally:
        await asyncio.to_thread(stop_dht, dht)


async def honest_nodes_store(attacker: hivemind.DHT, key: str, subkey, value, expiration: float) -> bool:
    """Did any other node store it? (`exclude_self`: the attacker's own storage does not count.)"""
    return bool(await attacker.store(key, value, expiration, subkey=subkey, exclude_self=True, return_future=True))


async def serve_from_attacker(attacker: hivemind.DHT, key: str, subkey, value, expiration: float) -> None:
    """Keep the forgery in the attacker's own storage, so that its node hands it to every lookup."""
    await attacker.store(key, value, expiration, subkey=subkey, return_future=True)


def coordinator_key(swarm: LocalSwarm) -> str:
    return json.loads((swarm.dir / "coordinator.json").read_text())["key"]


async def test_an_attacker_node_cannot_replace_or_lock_the_swarms_records(make_swarm):
    swarm = make_swarm(stages=2)
    maddrs = await asyncio.to_thread(swarm.start_coordinator, serving=False)
    swarm.start_peer(1, "--ttl", "6")  # a heartbeat every 2 s: the test waits for the one after the attacks
    victim = (await asyncio.to_thread(wait_for_event, swarm, "stage1", "ready"))[0]["peer_id"]

    async with honest_reader(maddrs) as reader, attacker_node(maddrs) as attacker:
        signed = await reader.fetch_run_spec()
        assert signed.fingerprint == coordinator_key(swarm)
        spec = RunSpec.from_json(signed.spec_json)
        await reader.adopt(spec)
        run, key = spec.run_hash, stage_key(spec.run_hash, 1)
        honest = (await eventually(lambda: reader.stage_peers(run, 1), what="the honest announcement"))[0]
        assert honest.peer_id == victim and honest.throughput < FAST

        # The attacker's own, validly signed announcement is stored: a public swarm is open, and this
        # also shows that the attacker's stores do reach the honest nodes.
        mine = Identity.generate()
        own = StageAnnouncement(mine.peer_id, run, 1, [], 1.0, 0, 0, "joining", "0.1.0")
        expiry = get_dht_time() + 15
        assert await honest_nodes_store(attacker, key, mine.peer_id,
                                        Envelope.seal(key, mine.peer_id, own.to_record(), expiry, mine).to_value(),
                                        expiry)

        raw = (await attacker.get(key, latest=True, return_future=True)).value[victim]
        genuine, genuine_expiry = raw.value, raw.expiration_time
        fake_ann = dataclasses.replace(honest, throughput=FAST, queue=0).to_record()
        impostor = SigningKey.generate()
        fake_spec = SignedRunSpec.create(spec.replace(codec="dense").to_json(), impostor)
        now = get_dht_time()
        fake_health = dataclasses.asdict(record(victim, run_hash=run, stage=1, step=10**6, timestamp=now))
        attacks = {
            "the victim's announcement, signed by the attacker":
                (key, victim, Envelope.seal(key, victim, fake_ann, now + 15, mine).to_value(), now + 15),
            "the victim's announcement, unsigned, expiring in a year":
                (key, victim, fake_ann, now + 365 * 86400),
            "the victim's genuine record replayed to live a day":
                (key, victim, genuine, genuine_expiry + 86400),
            "a plain value over the whole stage key, expiring in a year":
                (key, None, fake_ann, now + 365 * 86400),
            "a fake run spec under the impostor's key":
                (RUN_KEY, impostor.fingerprint(), Envelope.seal(RUN_KEY, impostor.fingerprint(), fake_spec.to_record(),
                                                                now + 60, Identity.of_key(impostor)).to_value(),
                 now + 60),
            "a fake run spec filed under the coordinator's key":
                (RUN_KEY, signed.fingerprint, Envelope.seal(RUN_KEY, signed.fingerprint, fake_spec.to_record(),
                                                            now + 60, Identity.of_key(impostor)).to_value(), now + 60),
            "a fake next basis version under the coordinator's key":
                (basis_key(run), basis_subkey(1, signed.fingerprint),
                 Envelope.seal(basis_key(run), basis_subkey(1, signed.fingerprint), b"U", now + 600,
                               Identity.of_key(impostor)).to_value(), now + 600),
            "a fake next basis version under the impostor's key":
                (basis_key(run), basis_subkey(1, impostor.fingerprint()),
                 Envelope.seal(basis_key(run), basis_subkey(1, impostor.fingerprint()), b"U", now + 600,
                               Identity.of_key(impostor)).to_value(), now + 600),
            "a fake health record of the victim":
                (health_key(run), victim, Envelope.seal(health_key(run), victim, fake_health, now + 15,
                                                        mine).to_value(), now + 15),
        }
        for what, (k, subkey, value, expiration) in attacks.items():
            assert not await honest_nodes_store(attacker, k, subkey, value, expiration), f"stored: {what}"
        for k, subkey, value, expiration in attacks.values():
            await serve_from_attacker(attacker, k, subkey, value, expiration)
        attacked_at = get_dht_time()

        # The honest reader sees the honest records only, though the attacker's node serves its forgeries.
        for _ in range(5):
            peers = {a.peer_id: a for a in await reader.stage_peers(run, 1)}
            assert peers[victim].throughput < FAST and set(peers) <= {victim, mine.peer_id}
            assert (await reader.fetch_run_spec(trusted_key=signed.public_key)).spec_json == signed.spec_json
            assert await reader.fetch_bases(run) == {}
            await asyncio.sleep(0.2)
        # ... and the victim's next heartbeat is stored: nothing locked its subkey
        async def next_beat():
            found = (await reader.dht.get(key, latest=True, return_future=True)).value.get(victim)
            ann = StageAnnouncement.from_record(Envelope.from_entry(victim, found.value, found.expiration_time)
                                                .record()) if found else None
            return found if ann and ann.timestamp > attacked_at and found.expiration_time < get_dht_time() + 60 \
                else None
        await eventually(next_beat, what="the victim's next heartbeat")
        health = {k: (v, x) for k, v, x in await fetch_health(reader, run)}
        if victim in health:  # the peer's own health record, if one is out by now, is its own
            assert parse_health(victim, *health[victim], reader.admission.policy).record.step < 10**6

        # A reader whose node has no validator (here: over the attacker's node) still refuses and counts.
        exposed = SwarmDHT(attacker)
        await exposed.adopt(spec)
        assert all(a.throughput < FAST for a in await exposed.stage_peers(run, 1))
        assert exposed.skipped_records >= 1
        try:
            seen = await exposed.fetch_run_spec(trusted_key=signed.public_key)
        except RecordError:  # its own node may hold only the forgery under the coordinator's key: refused
            seen = None
        assert seen is None or seen.spec_json == signed.spec_json
        assert await exposed.fetch_bases(run) == {}


async def test_a_private_swarm_accepts_no_record_from_an_outsider(tmp_path):
    key_path, id_path = tmp_path / "swarm.key", tmp_path / "admitted.key"
    swarm_key = SigningKey.load_or_create(key_path)
    swarm = LocalSwarm(LocalOptions(preset("tiny", stages=2), workdir=str(tmp_path / "run"), threads=1, quiet=True,
                                    coordinator_key=str(key_path)))
    try:
        cli = [sys.executable, "-m", "swarm.cli"]

        def admit() -> tuple[str, str]:  # the volunteer's identity and its ticket, made while the coordinator starts
            peer = subprocess.run([*cli, "identity", str(id_path)], capture_output=True, text=True, check=True,
                                  env=swarm._env()).stdout.strip()
            ticket = subprocess.run([*cli, "admit", "--key", str(key_path), "--peer-id", peer, "--expires", "1h"],
                                    capture_output=True, text=True, check=True, env=swarm._env()).stdout.strip()
            return peer, ticket

        maddrs, (peer, ticket) = await asyncio.gather(asyncio.to_thread(swarm.start_coordinator, "--private"),
                                                      asyncio.to_thread(admit))
        swarm.start_peer(1, "--identity", str(id_path), "--ticket", ticket)
        outsider = swarm.start_peer(1, name="outsider")  # no ticket
        assert await asyncio.to_thread(outsider.wait, 120) == 1
        swarm.procs = [(n, p) for n, p in swarm.procs if p is not outsider]  # it exited as it should
        ready = (await asyncio.to_thread(wait_for_event, swarm, "stage1", "ready"))[0]
        assert ready["peer_id"] == peer
        log = (swarm.dir / "outsider.log").read_text()
        assert "this swarm is private: ask its coordinator for one (`swarm admit" in log
        assert log.count("error:") == 1, "one clear refusal"

        async with honest_reader(maddrs) as reader, attacker_node(maddrs) as attacker:
            spec = RunSpec.from_json((await reader.fetch_run_spec(swarm_key.public_bytes())).spec_json)
            assert spec.extra["private"] is True
            await reader.adopt(spec)
            run, key = spec.run_hash, stage_key(spec.run_hash, 1)
            assert [a.peer_id for a in await eventually(lambda: reader.stage_peers(run, 1))] == [peer]
            assert await reader.admitted(peer)

            admitted = Identity.load_or_create(id_path)
            mine = Identity.generate()
            expiry = get_dht_time() + 15

            def announcement(who: Identity, ticket: bytes = b"", **changes) -> dict:
                ann = StageAnnouncement(who.peer_id, run, 1, [], FAST, 0, 0, "online", "0.1.0")
                return Envelope.seal(key, who.peer_id, dataclasses.replace(ann, **changes).to_record(), expiry, who,
                                     ticket).to_value()

            # control: a record of the admitted peer (with its ticket), carried by the attacker's node, is stored
            assert await honest_nodes_store(attacker, key, peer, announcement(admitted, ticket=Ticket.decode(
                ticket).to_bytes(), throughput=1.0), expiry)
            outsiders = {
                "no ticket": (key, mine.peer_id, announcement(mine), expiry),
                "a ticket from another key": (key, mine.peer_id, announcement(
                    mine, Ticket.issue(SigningKey.generate(), mine.peer_id).to_bytes()), expiry),
                "the admitted peer's ticket": (key, mine.peer_id, announcement(mine, Ticket.decode(ticket).to_bytes()),
                                               expiry),
                "a health record": (health_key(run), mine.peer_id, Envelope.seal(
                    health_key(run), mine.peer_id, {"step": 1}, expiry, mine).to_value(), expiry),
                "a run spec of its own": (RUN_KEY, SigningKey.generate().fingerprint(), {"spec_json": "{}"}, expiry),
            }
            for what, (k, subkey, value, expiration) in outsiders.items():
                assert not await honest_nodes_store(attacker, k, subkey, value, expiration), f"stored: {what}"
                await serve_from_attacker(attacker, k, subkey, value, expiration)
            for _ in range(5):
                assert [a.peer_id for a in await reader.stage_peers(run, 1)] == [peer]
                await asyncio.sleep(0.2)
            assert not await reader.admitted(mine.peer_id) and await reader.admitted(peer)
    finally:
        await asyncio.to_thread(swarm.stop)
