"""Grassmann basis updates in a real swarm: exact across switches, safe against bad updates,
and a restarted peer comes back on the current basis.

3 stages, subspace codec, basis_interval 5 (switch delay 2), fp32, one torch thread per peer.
"""
from __future__ import annotations

import asyncio

import torch

from protocol.basis_update import BasisUpdate, decode_update, encode_update
from protocol.spec import RunSpec, preset
from protocol.wire import ErrorReply, WireLimits, decode_message
from swarm.dht import SwarmDHT, close_node, start_dht
from swarm.local import LocalOptions, LocalSwarm
from swarm.net.transport import Transport
from swarm.trust.keys import SigningKey
from tests.e2e.conftest import wait_for_event

SPEC = dict(codec="subspace", stages=3, basis_interval=5)


def assert_matches(swarm_steps: list[dict], losses: list[float], first_step: int = 1) -> None:
    for rec in swarm_steps:
        want = losses[rec["step"] - 1]
        assert abs(rec["loss"] - want) / want < 1e-5, f"step {rec['step']}: swarm {rec['loss']} vs oracle {want}"
    assert swarm_steps[0]["step"] == first_step


class Client:
    """A DHT client and transport in the test process, speaking to the swarm's peers."""

    def __init__(self, maddrs: list[str]) -> None:
        self.maddrs = maddrs

    async def __aenter__(self) -> Client:
        self.dht = await asyncio.to_thread(start_dht, self.maddrs, ["/ip4/127.0.0.1/tcp/0"], None, True)
        self.sdht = SwarmDHT(self.dht)
        self.spec = RunSpec.from_json((await self.sdht.fetch_run_spec()).spec_json)
        await self.sdht.adopt(self.spec)  # basis updates count only under the key the spec names
        self.p2p = await self.dht.replicate_p2p()
        self.transport = Transport(self.p2p, f"subspace-swarm-{self.spec.run_hash}", timeout=30)
        return self

    async def __aexit__(self, *exc) -> None:
        await close_node(self.dht, self.p2p, self.transport)

    async def wait_for_version(self, version: int, timeout: float = 120) -> BasisUpdate:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            found = await self.sdht.fetch_bases(self.spec.run_hash)
            if version in found:
                return decode_update(found[version], self.spec)
            assert asyncio.get_running_loop().time() < deadline, f"basis version {version} never appeared"
            await asyncio.sleep(0.1)  # poll interval of the DHT

    async def refusal(self, peer: str, update: BasisUpdate) -> str:
        reply = await self.transport.request(peer, "basis", encode_update(update))
        assert reply != b"", f"peer {peer[-6:]} accepted a bad update (v{update.version} @ {update.effective_step})"
        msg = decode_message(reply, WireLimits.for_spec(self.spec))
        assert isinstance(msg, ErrorReply)
        return msg.reason


def _signed(spec: RunSpec, key: SigningKey, version: int, step: int, U: torch.Tensor) -> BasisUpdate:
    u = BasisUpdate(spec.run_hash, version, step, U)
    u.signature = key.sign(u.signing_bytes())
    return u


async def test_swarm_matches_oracle_across_switches_and_refuses_bad_updates(tmp_path, oracle_runs):
    steps = 30
    spec = preset("tiny", **SPEC)
    key_path = tmp_path / "swarm.key"
    key = SigningKey.load_or_create(key_path)
    swarm = LocalSwarm(LocalOptions(spec, steps=steps, workdir=str(tmp_path / "run"), quiet=True, threads=1,
                                    latency="15ms", coordinator_key=str(key_path)))
    try:
        maddrs = await asyncio.to_thread(swarm.start)
        follow = asyncio.create_task(asyncio.to_thread(swarm.follow))
        async with Client(maddrs) as c:
            v1 = await c.wait_for_version(1)
            peers = [wait_for_event(swarm, f"stage{s}", "ready")[0]["peer_id"] for s in range(3)]
            # v1 takes effect at step 7 on every stage: once the head has done step 8, all have applied it,
            # so a replay of it can only be refused as due at a step already started (no race with the push)
            await asyncio.to_thread(wait_for_event, swarm, "stage0", "step", 120, 8)
            # the oracle trains while the swarm does (one thread per peer, over links with latency: a core idles)
            oracle = asyncio.create_task(asyncio.to_thread(oracle_runs.losses, spec, steps))
            stranger = SigningKey.generate()
            for peer in peers:
                reasons = [
                    await c.refusal(peer, _signed(c.spec, stranger, 2, 10_000, v1.U)),  # forged
                    await c.refusal(peer, v1),  # replayed (genuine, already applied)
                    await c.refusal(peer, _signed(c.spec, key, 9, 10_000, v1.U)),  # skips versions
                    await c.refusal(peer, _signed(c.spec, key, 1, 1, v1.U)),  # genuine key, for a past step
                ]
                assert "not signed" in reasons[0]
                assert "already started" in reasons[1]
                assert "not the next" in reasons[2]
                assert "already started" in reasons[3]
            published = [await c.wait_for_version(v) for v in (1, 2, 3, 4, 5)]
        swarm_steps = await follow
    finally:
        await asyncio.to_thread(swarm.stop)

    losses, log = await oracle, oracle_runs.basis_log(spec, steps)
    assert_matches(swarm_steps, losses)
    assert [(u.version, u.effective_step) for u in published] == log[:5]
    # the steps report the basis version they trained with: each switch is where the oracle put it
    for rec in swarm_steps:
        want = sum(1 for _, eff in log if eff <= rec["step"] - 1)
        assert rec["basis_version"] == want, f"step {rec['step']} on version {rec['basis_version']}, want {want}"


async def test_restarted_head_comes_back_on_the_current_basis(tmp_path, oracle_runs):
    spec = preset("tiny", **SPEC)
    ckpt = tmp_path / "ckpt"
    swarm = LocalSwarm(LocalOptions(spec, steps=13, workdir=str(tmp_path / "run"), quiet=True, threads=1))
    try:
        await asyncio.to_thread(swarm.start_coordinator, serving=False)
        for s in (1, 2):
            swarm.start_peer(s)
        first = swarm.start_peer(0, "--steps", "13", "--checkpoint-dir", str(ckpt), name="head")
        await asyncio.to_thread(wait_for_event, swarm, "head", "done", 180)
        assert await asyncio.to_thread(first.wait, 60) == 0
        swarm.procs = [(n, p) for n, p in swarm.procs if p is not first]  # it finished as asked, not crashed
        # the oracle trains meanwhile (one torch thread): the swarm waits for its head now
        oracle = asyncio.create_task(asyncio.to_thread(oracle_runs.losses, spec, 17))
        before = [e for e in swarm.events("head") if e["event"] == "step"]
        assert before[-1]["basis_version"] == 2, "two updates (effective at steps 8 and 13) were expected"

        swarm.start_peer(0, "--steps", "17", "--checkpoint-dir", str(ckpt), "--resume", name="head2")  # 4 more
        after = await asyncio.to_thread(wait_for_event, swarm, "head2", "step", 180, 4)
    finally:
        await asyncio.to_thread(swarm.stop)

    losses = await oracle
    assert_matches(before, losses, first_step=1)
    assert_matches(after, losses, first_step=14)
    assert after[0]["basis_version"] == 2
