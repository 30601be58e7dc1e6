"""A sender banned for a payload that only the band around the median refused (docs/security.md, Bounded trust in
numbers; the band itself: tests/peer/test_norm_band.py; the absolute cap end to end: tests/e2e/test_attacks.py).

A hostile stage-2 replica joins once stage 1's gradient band has warmed up and answers the microbatch routed to it
with a gradient of the right shape, signed, finite and far under the absolute cap (1e4), but 1e5 x the median of what
stage 1 has been receiving. Stage 1 refuses it as far outside the band and bans its sender in its real `Router`
(every peer here routes with one, as in tests/swarm/test_deadlines.py); the microbatch goes to the honest replica,
nobody else is banned, and the run equals the one-process run (fp64)."""
from __future__ import annotations

import asyncio
import statistics

import pytest
import torch

from peer.replica.memory_swarm import TEST_DRIVER_OPTIONS, MemorySwarm
from protocol.boundary_sig import seal, statement, unseal
from protocol.codecs import WirePacker
from protocol.spec import preset
from protocol.spot_check import digest
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_GRADIENT,
    ErrorReply,
    Header,
    WireLimits,
    decode_message,
    encode_gradient,
)
from tests.peer.test_replicas import SMALLER
from tests.swarm.test_deadlines import LoopbackRouter, RouterNetwork

pytestmark = pytest.mark.idle_clock  # waits for deadlines, probes and back-offs: tests/idle_clock.py

STEPS, JOINS_AFTER, HOSTILE = 8, 5, "s2zz"
FAR = 1e5  # over the band's 1e4 x the median


async def test_a_sender_whose_payload_only_the_band_refuses_is_banned(oracle_runs):
    spec = preset("tiny", stages=3, codec="subspace", dtype="fp64", wire_dtype="fp64", batch_size=32,
                  microbatch_size=8, lr=1e-3, **SMALLER)
    # a microbatch's deadline of 10 s at least: the band, not a deadline passed on a loaded machine, must judge the
    # hostile gradient (a gradient past its deadline is refused before the band sees it)
    swarm = MemorySwarm(spec, RouterNetwork(), driver_options=dict(TEST_DRIVER_OPTIONS, min_timeout=60.0,
                                                                   first_timeout=60.0),
                        daemon_options=dict(deadline_floor=10.0))
    for name, stage in (("s0r0", 0), ("s1r0", 1), ("s2r0", 2)):
        await swarm.add(stage, name)
    band = swarm.peers["s1r0"].daemon.bands[KIND_GRADIENT]
    router = swarm.peers["s1r0"].daemon.directory
    failures: list[tuple[str, bool]] = []  # stage 1's reports, in order: (peer, for bad data)
    report = router.report_failure
    router.report_failure = lambda peer, bad_data=False: (failures.append((peer, bad_data)), report(peer, bad_data))
    packer, link, signer = WirePacker.for_spec(spec), swarm.net.link(HOSTILE), swarm.net.keys.signer(HOSTILE)
    sent: list[dict] = []

    async def answer(h: Header, to: str) -> None:
        """A gradient for the microbatch, signed as an honest replica signs it, sized FAR x the band's median."""
        median = statistics.median(band._seen)
        values = torch.full((spec.microbatch_size, spec.seq_len, spec.boundary_width), median * FAR,
                            dtype=torch.float64)
        back = Header(spec.run_hash, h.step, h.microbatch, h.basis_version, spec.codec, 1, h.attempt)
        body = encode_gradient(back, packer.pack(values), 1.0)
        sig = signer.sign(statement(spec.run_hash, h.step, h.attempt, h.microbatch, KIND_GRADIENT, to, digest(body)))
        reply = await link.request(to, KIND_GRADIENT, seal(sig, body))
        refusal = decode_message(reply, WireLimits.for_spec(spec)) if reply else None
        sent.append(dict(rms=median * FAR, median=median, warmed=band.accepted,
                         reason=refusal.reason if isinstance(refusal, ErrorReply) else "accepted"))

    async def hostile(frame: bytes, sender: str) -> bytes:
        h = decode_message(unseal(frame)[1], WireLimits.for_spec(spec, accept_next_basis=True)).header
        asyncio.get_running_loop().create_task(answer(h, sender))
        return b""  # taken; its gradient follows

    def on_step(log) -> None:
        if log.step == JOINS_AFTER:  # the band has taken 4 microbatches a step: past its warm-up of 16
            swarm.net.handlers[(HOSTILE, KIND_ACTIVATION)] = hostile
            asyncio.get_running_loop().create_task(LoopbackRouter(swarm.net, HOSTILE).announce(
                swarm.peers["s2r0"].status("online")))
    try:
        logs = await asyncio.wait_for(swarm.drive(STEPS, on_step), 240)
        await swarm.applied()
    finally:
        await swarm.stop()
    assert len(sent) == 1, sent  # probation: one microbatch, then banned
    got = sent[0]
    assert got["warmed"] >= 16 and got["rms"] < band.absolute, got  # past the warm-up, under the absolute cap
    assert "far outside what this stage has been receiving" in got["reason"], got
    routers = {name: p.daemon.directory for name, p in swarm.peers.items()}
    # banned for bad data (300 s), before its microbatch's deadline passed (which bans it again, to no effect)
    assert failures[0] == (HOSTILE, True) and {peer for peer, _ in failures} == {HOSTILE}, failures
    assert router.banned_peers() == {HOSTILE: 1} and router.is_banned(HOSTILE)
    # nobody else banned, by anyone (the head may avoid the hostile id too: it answers none of its commands)
    assert all(set(r.banned_peers()) <= {HOSTILE} for r in routers.values()), \
        {name: r.banned_peers() for name, r in routers.items()}
    assert [log.step for log in logs] == list(range(1, STEPS + 1))
    for log, want in zip(logs, oracle_runs.losses(spec, STEPS)):
        assert abs(log.loss - want) <= 1e-10 * abs(want), f"step {log.step}: swarm {log.loss!r} vs oracle {want!r}"
