"""Bad input against live peers: a stranger is refused by every handler before anything is
decoded; a peer announced for stage 1 (so allowed to talk to stage 2) gets a clear refusal for
every malformed message; the peers keep serving, and their state is exactly what it was
(weights, optimizer state, step and basis version of the checkpoint they write when stopped,
compared with a freshly built stage)."""
from __future__ import annotations

import asyncio
import signal
import time

import msgpack
import torch

from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from peer.runner.stage import StageRunner
from protocol.codecs import WirePacker
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT, ActivationMessage, Header, encode_message, tokens_for_wire
from tests.e2e.attacker import Attacker
from tests.e2e.conftest import wait_for_event

GARBAGE = b"\x93\xc1garbage\xff" * 7


async def test_live_peers_refuse_bad_input_and_their_state_does_not_change(make_swarm, tmp_path):
    swarm = make_swarm(codec="subspace")
    ck = tmp_path / "ck"
    maddrs = await asyncio.to_thread(swarm.start_coordinator)
    # a message for the next step waits 1 s (not the default 10) for a step that never comes here
    peers = {s: swarm.start_peer(s, "--checkpoint-dir", str(ck), "--next-step-wait", "1") for s in (1, 2)}
    ids = {s: (await asyncio.to_thread(wait_for_event, swarm, f"stage{s}", "ready"))[0]["peer_id"] for s in (1, 2)}
    async with Attacker(maddrs) as stranger:
        for s, kinds in ((1, (KIND_ACTIVATION, KIND_GRADIENT)), (2, (KIND_ACTIVATION,))):
            for kind in kinds:
                code, reason = await stranger.send(ids[s], kind, GARBAGE)
                assert code not in ("accepted", "transport") and "only peers announced" in reason, (s, kind, reason)
    async with Attacker(maddrs) as a:
        await a.announce(1)
        await a.until_member(ids[2], KIND_ACTIVATION)
        spec = a.spec
        B, T, w = spec.microbatch_size, spec.seq_len, spec.boundary_width

        def act(**change) -> bytes:
            return a.activation(change.pop("step", 0), change.pop("stage", 2), **change)

        cases = {
            "garbage": (GARBAGE, "not valid msgpack"),
            "not a map": (msgpack.packb([1, 2, 3]), "not a msgpack map"),
            "wrong shape": (act(width=w + 1), "shape"),
            "wrong dtype": (encode_message(ActivationMessage(
                Header(spec.run_hash, 0, 0, 0, spec.codec, 2), tokens_for_wire(torch.zeros(B, T + 1, dtype=torch.long),
                                                                               spec.vocab),
                WirePacker("bf16").pack(torch.randn(B, T, w)))), "dtype"),
            "wrong run hash": (act(run="0123456789abcdef"), "run"),
            "wrong basis version": (act(basis_version=3), "basis version"),
            "far future step": (act(step=7), "not for the step"),
            "next step": (act(step=1), "not for the step"),
            "wrong stage": (act(stage=1), "stage"),
            "enormous values": (act(scale=1e30), "out of range"),
            "after a ban": (act(), "banned"),  # the enormous values got this sender banned
        }
        for name, (body, words) in cases.items():
            sent = time.monotonic()
            code, reason = await a.send(ids[2], KIND_ACTIVATION, body)
            assert code not in ("accepted", "transport"), f"{name} was not refused ({code})"
            assert words.lower() in reason.lower(), f"{name}: unclear refusal {reason!r}"
            if name == "next step":  # held --next-step-wait (1 s), not the default 10 s
                assert time.monotonic() - sent < 8, f"the next-step message was held {time.monotonic() - sent:.1f} s"
    for p in peers.values():
        assert p.poll() is None, "a peer died"
        p.send_signal(signal.SIGTERM)  # it writes its checkpoint as it stops
        assert await asyncio.to_thread(p.wait, 60) == 0
    swarm.procs = [(n, p) for n, p in swarm.procs if p not in peers.values()]  # they stopped as asked
    for s in (1, 2):  # nothing of the above touched the stage: it is the stage as built from the spec
        saved, fresh = load_checkpoint(checkpoint_path(ck, spec.run_hash, s)), StageRunner(spec, s).state_dict()
        assert saved["step"] == fresh["step"] == 0 and saved["basis_version"] == fresh["basis_version"] == 0
        assert saved["optimizer"]["state"] == fresh["optimizer"]["state"] == {}
        for name, t in fresh["module"].items():
            assert torch.equal(saved["module"][name], t), f"stage {s}: {name} changed"
