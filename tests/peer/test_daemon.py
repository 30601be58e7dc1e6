"""The peers' behaviour over the in-memory loopback network: one replica per stage trains
exactly like the in-process pipeline, and a delivered message whose reply was lost is neither
lost nor applied twice. No attempt may fail here, so the swarms get deadlines no loaded machine
misses (`patient_options`): every step takes one attempt, and the traffic is counted exactly."""
from __future__ import annotations

import threading
import time

import torch

from peer.daemon.interfaces import LinkError
from peer.daemon.loopback import LoopbackLink
from protocol.spec import preset
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT, ErrorReply, decode_message
from tests.peer.swarm_in_memory import make_swarm, patient_options

STEPS = 6


class LossyLink(LoopbackLink):
    """Delivers every request, but loses the reply of every third new boundary message (a
    transient failure: the sender sees an error, and a repeat of the same message gets its reply)."""

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        if kind not in (KIND_ACTIVATION, KIND_GRADIENT):
            return reply
        seen = self.net.__dict__.setdefault("seen", set())
        if body not in seen:
            seen.add(body)
            self.net.sent = getattr(self.net, "sent", 0) + 1
            if self.net.sent % 3 == 0:
                raise LinkError("the stream closed before the reply arrived")
        return reply


async def _train(link_cls):
    spec = preset("tiny", stages=3)
    swarm = await make_swarm(spec, [1, 1, 1], link_cls, **patient_options())
    try:
        logs = await swarm.drive(STEPS)
    finally:
        await swarm.stop()
    return spec, [log.loss for log in logs], swarm


async def test_daemons_over_loopback_equal_the_pipeline(oracle_runs):
    spec, losses, swarm = await _train(LoopbackLink)
    assert losses == oracle_runs.losses(spec, STEPS)
    tokens = STEPS * 16 * 64
    daemons = [swarm.stage(s)[0].daemon for s in range(3)]
    assert [d.sent_tokens[KIND_ACTIVATION] for d in daemons] == [tokens, tokens, 0]
    assert [d.sent_tokens[KIND_GRADIENT] for d in daemons] == [0, tokens, tokens]
    assert all(d.refused == 0 for d in daemons)
    assert all(log.attempts == 1 for log in swarm.logs)


async def test_lost_replies_are_neither_lost_nor_applied_twice(oracle_runs):
    spec, losses, swarm = await _train(LossyLink)
    assert swarm.net.sent >= 4 * STEPS * 2  # two boundaries, both directions, two microbatches a step
    assert losses == oracle_runs.losses(spec, STEPS)  # every microbatch applied exactly once
    tokens = STEPS * 16 * 64
    daemons = [swarm.stage(s)[0].daemon for s in range(3)]
    assert [d.sent_tokens[KIND_ACTIVATION] for d in daemons] == [tokens, tokens, 0]
    assert [d.sent_tokens[KIND_GRADIENT] for d in daemons] == [0, tokens, tokens]
    assert sum(d.refused for d in daemons) > 0  # the repeats were recognised and refused as duplicates
    # a lost reply costs a repeat of that one message, never a re-driven step (which would resend all)
    assert all(log.attempts == 1 for log in swarm.logs)
    assert all(torch.isfinite(p).all() for d in daemons for p in d.runner.module.parameters())


class LoseFirstGradientReply(LoopbackLink):
    """Loses the reply of the swarm's first gradient message (it was delivered, so its sender
    repeats it: the same bytes), and keeps the reply the repeat gets in `replies` (the lost one
    first); `repeat_answered` is set once it came. Other gradients may pass in between."""
    repeat_answered = threading.Event()
    replies: list[bytes] = []
    first: list[bytes] = []

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        reply = await super().request(peer, kind, body, timeout)
        if kind != KIND_GRADIENT:
            return reply
        cls = type(self)
        if not cls.first:
            cls.first.append(body)
            cls.replies.append(reply)
            raise LinkError("the stream closed before the reply arrived")
        if body == cls.first[0] and not cls.repeat_answered.is_set():
            cls.replies.append(reply)
            cls.repeat_answered.set()
        return reply


async def test_a_gradient_repeated_while_its_backward_runs_is_a_duplicate(oracle_runs):
    """The repeat of a delivered gradient whose reply was lost can arrive while the receiver still
    runs that microbatch's backward (a loaded machine makes this window seconds wide; here it is
    held open until the repeat was answered): it must be answered "duplicate", so the sender
    counts it delivered once, and the swarm still trains like the oracle."""
    link = type("Link", (LoseFirstGradientReply,), {"repeat_answered": threading.Event(), "replies": [], "first": []})
    spec = preset("tiny", stages=3)
    swarm = await make_swarm(spec, [1, 1, 1], link, **patient_options())
    middle = swarm.stage(1)[0]
    accumulate = middle.runner._accumulate_stat  # called inside backward, in the worker thread
    held = []

    def held_open(probe) -> None:
        if not held:  # the first backward here is the lost reply's microbatch: finish it after the repeat
            held.append(link.repeat_answered.wait(timeout=60))
        accumulate(probe)

    middle.runner._accumulate_stat = held_open
    try:
        logs = await swarm.drive(2)
    finally:
        await swarm.stop()
    assert held == [True], "the repeat never came while the backward was held open"
    repeat = decode_message(link.replies[1], middle.daemon._limits())
    assert isinstance(repeat, ErrorReply) and repeat.code == "duplicate", repeat
    assert [log.loss for log in logs] == oracle_runs.losses(spec, 2)
    assert swarm.stage(2)[0].daemon.sent_tokens[KIND_GRADIENT] == 2 * 16 * 64  # the repeat is counted once


class NotesActivations(LoopbackLink):
    """Sets `sent` when an activation leaves for the middle stage while `watching` is set."""
    watching = threading.Event()
    sent = threading.Event()

    async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
        if kind == KIND_ACTIVATION and peer == "s1r0" and type(self).watching.is_set():
            type(self).sent.set()
        return await super().request(peer, kind, body, timeout)


async def test_a_next_step_message_during_the_optimizer_step_waits_for_it(oracle_runs):
    """The worker thread counts the step (runner.step += 1) before the event loop hears that the step
    is done (`stepped()`, which starts attempt 0). An activation of the next step arriving in between
    (on a GPU the head is that fast) must wait, not meet the old step's attempt and be refused as
    stale (which failed the attempt, and a re-driven one could stall until the step timeout). Here
    the middle stage's optimizer step is held open until such an activation was sent to it."""
    link = type("Link", (NotesActivations,), {"watching": threading.Event(), "sent": threading.Event()})
    spec = preset("tiny", stages=3)
    swarm = await make_swarm(spec, [1, 1, 1], link, **patient_options())
    middle = swarm.stage(1)[0]
    apply_reduced = middle.runner.apply_reduced  # runs in the middle stage's worker thread
    held = []

    def held_open(step: int, attempt: int, skip: bool = False):
        record = apply_reduced(step, attempt, skip)  # the step is counted here
        if not held:
            link.watching.set()
            held.append(link.sent.wait(timeout=60))
            time.sleep(0.2)  # the activation reaches the middle stage's event loop meanwhile
        return record

    middle.runner.apply_reduced = held_open
    try:
        logs = await swarm.drive(3)
    finally:
        await swarm.stop()
    assert held == [True], "no activation of the next step came while the optimizer step was held open"
    assert all(log.attempts == 1 for log in logs), [log.attempts for log in logs]
    assert middle.daemon.refused == 0
    assert [log.loss for log in logs] == oracle_runs.losses(spec, 3)


async def test_payloads_reach_the_device_on_the_stage_worker_not_the_event_loop(monkeypatch):
    """A copy to an accelerator waits for the compute already queued there: made on the event loop,
    it stalled every message for a job's length (GPU stages idled ~30%). A payload is judged on the host
    and unpacked onto the stage's device by the worker thread only; each stage's worker did real work."""
    from protocol.codecs import WirePacker

    where: list[tuple[str, bool]] = []  # (thread, whether a device was named) of every unpack
    unpack = WirePacker.unpack

    def spy(self, w, like, *device):
        where.append((threading.current_thread().name, bool(device)))
        return unpack(self, w, like, *device)
    monkeypatch.setattr(WirePacker, "unpack", spy)
    spec, losses, swarm = await _train(LoopbackLink)
    to_device = {t for t, named in where if named}
    assert to_device and all(t.startswith("stage") for t in to_device), to_device
    assert {t for t, named in where if not named} and len(where) >= 4 * STEPS * spec.n_microbatches
    assert all(swarm.stage(s)[0].daemon.worker_busy_s > 0 for s in range(3))
