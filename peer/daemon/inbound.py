"""The inbound half of a `StageDaemon`: what a stage does with an activation, a gradient or a
basis update that another peer sends it.

Every message is validated before it is acknowledged (admission, wire format, stage, size
band, step and attempt, basis version, microbatch), in an order that matters: the size check
comes before the step checks, so enormous values ban their sender whatever step they claim.
In an fp16 run a gradient is judged by its size over the loss scale, and one flagged as an
overflow is taken as zeros without a size check (peer/runner/loss_scaling.py).
A boundary message comes signed by its sender (protocol/boundary_sig.py): after every other check, and
before it is accepted, the signature must verify against the sender's key for this peer as receiver; it is
kept with the message's digest (peer/daemon/boundary_log.py), the sender's evidence of what it sent.
A refusal is an `ErrorReply` and never touches the runner's state; accepted work is queued on
the daemon's worker thread (`run_for`) and its result sent on by the daemon's `Courier`.
The size band judges the payload on the host; it reaches the accelerator on the worker thread,
since a copy there from the event loop would wait for the compute already queued.
"""
from __future__ import annotations

import time

import torch

from protocol.basis_update import decode_update
from protocol.boundary_sig import statement, unseal
from protocol.codecs import WireTensors
from protocol.spot_check import digest
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_GRADIENT,
    ActivationMessage,
    GradientMessage,
    Header,
    WireError,
    decode_message,
)

from .delivery import ACK
from .interfaces import LinkError

SKIPPED = object()  # what `StageDaemon.run_for` returns for work of an aborted attempt


class InboundHandlers:
    """Mixed into `StageDaemon` (peer/daemon/daemon.py), whose state and helpers these handlers use."""

    def _unsigned(self, kind: str, h: Header, said: bytes, sig: bytes, sender: str) -> bytes | None:
        """A refusal unless `sig` is `sender`'s signature of this message (digest `said`) to this peer (no signer
        here: none)."""
        signer = getattr(self.link, "signer", None)
        if signer is None or signer.verify(
                sender, statement(h.run, h.step, h.attempt, h.microbatch, kind, self.peer_id, said), sig):
            return None
        return self.refuse(f"the {'activation' if kind == KIND_ACTIVATION else 'gradient'} is not signed by its "
                           f"sender for this peer.", sender)

    async def _on_activation(self, frame: bytes, sender: str) -> bytes:
        if (refusal := await self.admitted(sender, KIND_ACTIVATION)) is not None:
            return refusal
        sig, body = unseal(frame)
        try:
            msg = decode_message(body, self._limits())
        except WireError as e:
            return self.refuse(str(e), sender)
        if not isinstance(msg, ActivationMessage):
            return self.refuse("the forward handler takes activation messages only.", sender)
        h = msg.header
        if h.stage != self.stage:
            return self.refuse(f"this peer serves stage {self.stage}, not {h.stage}.", sender)
        # the size check comes before the step checks: enormous values ban their sender whatever
        # step or microbatch they claim (a stale or duplicate one included)
        if (refusal := self._out_of_band(KIND_ACTIVATION, await self.payload_rms(msg.payload), sender)) is not None:
            return refusal
        named = self.feeders  # the heads the leader named (peer/commit/head_work.py): (step, attempt), leader, heads
        if self.stage == 1 and named is not None and sender in named[2] and sender != named[1] and (
                named[0] == (self.runner.step, self.attempt) != (h.step, h.attempt)):
            # checked before `_admit`, which follows a newer attempt: only the leader may start one (once that
            # attempt is here, the assignment is stale and a head it named counts for no more than any other)
            return self.refuse("a head may send activations only for the attempt the leader named it for.", sender,
                               code="stale")
        problem = await self._admit(h, sender)
        if problem:
            return self.refuse(problem[0], sender, code=problem[1])
        refusal = self._check_version(h, sender)
        if refusal is not None:
            return refusal
        if self.stage == 1 and named is not None and named[0] == (h.step, h.attempt) and sender not in named[2]:
            return self.refuse("only the heads the leader named for this step may send it activations.", sender)
        if not 0 <= h.microbatch < self.spec.n_microbatches:
            return self.refuse(f"microbatch {h.microbatch} is outside 0..{self.spec.n_microbatches - 1}.", sender)
        if h.microbatch in self._upstream or self.runner.has_seen(h.microbatch):
            return self.refuse("this microbatch is already here.", sender, code="duplicate")
        said = digest(body)
        if (refusal := self._unsigned(KIND_ACTIVATION, h, said, sig, sender)) is not None:
            return refusal
        self._upstream[h.microbatch] = (sender, msg.tokens)
        self.boundary.received(h.step, h.attempt, KIND_ACTIVATION, h.microbatch, body, sender, sig, said)  # an input
        self.spawn(self._process_activation(h, msg.tokens, msg.payload, sender))
        return ACK

    def named_heads(self) -> frozenset[str]:
        """Stage 1: heads the leader named for the attempt in progress here (peer/commit/head_work.py), or none."""
        named = self.feeders
        return named[2] if named is not None and named[0] == (self.runner.step, self.attempt) else frozenset()

    def _note_tokens(self, n: int) -> None:
        """Throughput of this stage: tokens through forward over the last ~10 s."""
        now = time.monotonic()
        self._window.append((now, n))
        while self._window and now - self._window[0][0] > 10.0:
            self._window.popleft()
        span = max(now - self._window[0][0], 1.0)
        self.throughput = sum(k for _, k in self._window) / span
        self.tokens_done += n

    async def _process_activation(self, h: Header, tokens: torch.Tensor, z: WireTensors, sender: str) -> None:
        self._note_tokens(z.values.shape[0] * z.values.shape[1])
        if self.runner.is_last:
            done = await self.run_for(h, self._tail_job, h, tokens, z)
            if done is SKIPPED or not self.current(h):
                return  # the attempt was aborted while this stage computed
            body, ntokens, self.last_loss = done
            self._upstream.pop(h.microbatch, None)
            said = digest(body)
            await self.courier.send(self.stage - 1, KIND_GRADIENT, body, ntokens, to=sender, h=h, said=said)
            self.boundary.sent_gradient(h.step, h.attempt, h.microbatch, sender, said)
            return
        done = await self.run_for(h, self._forward_job, h, tokens, z)
        if done is not SKIPPED:
            await self._forward(h, *done)

    async def _on_gradient(self, frame: bytes, sender: str) -> bytes:
        if (refusal := await self.admitted(sender, KIND_GRADIENT)) is not None:
            return refusal
        sig, body = unseal(frame)
        try:
            msg = decode_message(body, self._limits())
        except WireError as e:
            return self.refuse(str(e), sender)
        if not isinstance(msg, GradientMessage):
            return self.refuse("the backward handler takes gradient messages only.", sender)
        h = msg.header
        if h.stage != self.stage:
            return self.refuse(f"this peer serves stage {self.stage}, not {h.stage}.", sender)
        zeroed = msg.overflow and self.runner.loss_scale is not None  # fp16: the sender overflowed
        # worked out before the checks that follow, which must not be split by an await: a repeat of this
        # gradient could pass them meanwhile
        rms = 0.0 if zeroed else await self.payload_rms(msg.payload)
        if h.step != self.runner.step or h.attempt != self.attempt:
            old = h.step < self.runner.step or (h.step == self.runner.step and h.attempt < self.attempt)
            return self.refuse("the gradient is not for the step and attempt in progress here.", sender,
                               code="duplicate" if h.step < self.runner.step else "stale" if old else "refused")
        refusal = self._check_version(h, sender)
        if refusal is not None:
            return refusal
        sent = self._downstream.get(h.microbatch)
        pending = self.runner.pending_shape(h.microbatch)
        if pending is None or sent is None:
            if self._gradient_taken.get(h.microbatch) == sender or self.runner.has_seen(h.microbatch):
                return self.refuse("the gradient of this microbatch was already applied.", sender, code="duplicate")
            return self.refuse("no forward pass is waiting for this microbatch.", sender)
        if sent[0] != sender:
            return self.refuse("this microbatch's gradient must come from the peer its activation went to.", sender)
        if tuple(msg.payload.values.shape) != pending:
            return self.refuse(f"gradient shape {list(msg.payload.values.shape)} does not match the activation "
                               f"{list(pending)}.", sender)
        # fp16: an overflow's stand-in (zeros, on the worker) is not judged, nor learnt from
        if not zeroed and (refusal := self._out_of_band(KIND_GRADIENT, rms, sender, self.runner.scale)) is not None:
            fut = self.waiting.get(h.microbatch)
            if fut is not None and not fut.done():  # the head: this attempt fails now, not at its deadline
                fut.set_exception(LinkError(f"peer {sender[-8:]} answered microbatch {h.microbatch} with "
                                            "out-of-band gradients"))
            return refusal
        said = digest(body)
        if (refusal := self._unsigned(KIND_GRADIENT, h, said, sig, sender)) is not None:
            return refusal
        del self._downstream[h.microbatch]
        self._gradient_taken[h.microbatch] = sender
        self.boundary.received(h.step, h.attempt, KIND_GRADIENT, h.microbatch, body, sender, sig, said)
        self.boundary.answered(h.step, h.attempt, h.microbatch, sender)
        seconds = time.monotonic() - sent[1]
        self.directory.release(sender, seconds)
        self._answered(h.microbatch, seconds)
        self._returned.add(sender)
        self.spawn(self._process_gradient(h, msg.payload, msg.loss, zeroed))
        return ACK

    async def _process_gradient(self, h: Header, grad: WireTensors, loss: float, overflow: bool = False) -> None:
        done = await self.run_for(h, self._backward_job, h, grad, loss, overflow)
        if done is SKIPPED:
            return
        body, ntokens, _ = done
        if self.runner.is_first:
            fut = self.waiting.get(h.microbatch)
            if fut is not None and not fut.done():
                fut.set_result(loss)
            return
        upstream = self._upstream.pop(h.microbatch, None)
        if upstream is None or not self.current(h):
            return  # the attempt was superseded while this backward ran
        said = digest(body)
        await self.courier.send(self.stage - 1, KIND_GRADIENT, body, ntokens, to=upstream[0], h=h, said=said)
        self.boundary.sent_gradient(h.step, h.attempt, h.microbatch, upstream[0], said)

    async def _on_basis(self, body: bytes, sender: str) -> bytes:
        try:
            update = decode_update(body, self.spec)
        except WireError as e:
            return self.refuse(str(e), sender)
        problem = await self.accept_update(update)
        return self.refuse(problem, sender) if problem else ACK
