"""`StageDaemon`: the asyncio service around a StageRunner; what a head, middle or tail does.

Message flow (DESIGN.md section 3). The head drives each step: it runs forward on its
microbatches and sends the boundary tensors on; a middle peer decodes, runs forward and
forwards; the tail computes the loss, runs backward and returns the compressed gradient
to whoever sent the activation, and so on back to the head. Every stage steps its
optimizer once all of the step's microbatches have been through its backward, *before*
it passes the last gradient upstream, so when the head holds every gradient of step s the
whole pipeline has finished step s and step s+1 can start: steps never mix.

Inbound messages are validated (wire.py, then step and microbatch checks) before they are
acknowledged; a refusal is an `ErrorReply`, and refused messages never touch the runner's
state. Accepted work runs on one worker thread, in order, never on the event loop.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import torch

from protocol.codecs import WirePacker
from protocol.wire import (ActivationMessage, ErrorReply, GradientMessage, Header, WireError, WireLimits,
                           decode_message, encode_message, tokens_for_wire)

from .interfaces import LinkError, MessageLink, PeerDirectory, PeerStatus
from .stage import StageError, StageRunner

log = logging.getLogger(__name__)

KIND_FORWARD, KIND_BACKWARD = "act", "grad"
ACK = b""


@dataclass
class StepLog:
    step: int  # 1-based: the number of optimizer steps done after this one
    loss: float
    tokens: int
    seconds: float
    basis_version: int
    lr: float


class StepFailed(RuntimeError):
    """A step could not complete (a stage is missing or stopped answering)."""


class StageDaemon:
    def __init__(self, runner: StageRunner, link: MessageLink, directory: PeerDirectory, *,
                 batches: Callable[[int, int], torch.Tensor] | None = None,
                 microbatches: list[int] | None = None, step_timeout: float = 120.0,
                 send_retries: int = 3, future_step_wait: float = 30.0) -> None:
        self.runner, self.link, self.directory = runner, link, directory
        self.spec = runner.spec
        self.stage = runner.stage
        self.packer = WirePacker.for_spec(self.spec)
        self.batches = batches
        self.microbatches = microbatches if microbatches is not None else list(range(self.spec.n_microbatches))
        self.step_timeout, self.send_retries, self.future_step_wait = step_timeout, send_retries, future_step_wait
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage{self.stage}")
        self._upstream: dict[int, tuple[str, torch.Tensor]] = {}  # microbatch -> (sender, tokens)
        self._waiting: dict[int, asyncio.Future] = {}  # head: microbatch -> future of its loss
        self._step_changed = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()
        self.refused = 0
        self.sent_tokens = {KIND_FORWARD: 0, KIND_BACKWARD: 0}  # tokens per kind, for bytes-per-token
        self.tokens_done = 0
        self.throughput = 0.0
        self.last_loss = float("nan")

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if not self.runner.is_first:
            await self.link.serve(KIND_FORWARD, self._on_activation)
        if not self.runner.is_last:
            await self.link.serve(KIND_BACKWARD, self._on_gradient)
        await self.directory.announce(self.status("online"))

    def status(self, state: str = "online") -> PeerStatus:
        return PeerStatus(self.stage, state, self.throughput, len(self._upstream), self.runner.basis_version,
                          self.runner.step, {"loss": self.last_loss, "refused": self.refused})

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._worker.shutdown(wait=True, cancel_futures=True)

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn, *args)

    def _spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_task_error)

    def _limits(self) -> WireLimits:
        return WireLimits.for_spec(self.spec, self.runner.basis_version)

    def _header(self, step: int, mb: int, to_stage: int) -> Header:
        return Header(self.spec.run_hash, step, mb, self.runner.basis_version, self.spec.codec, to_stage)

    def _refuse(self, reason: str, sender: str, code: str = "refused") -> bytes:
        self.refused += 1
        log.warning("stage %d refused a message from %s: %s", self.stage, sender[-8:], reason)
        return encode_message(ErrorReply(reason, code))

    # ------------------------------------------------------------------ sending
    async def _send(self, stage: int, kind: str, body: bytes, tokens: int, to: str | None = None) -> None:
        """Deliver to `to`, or to a peer of `stage` picked by the router, retrying other peers."""
        tried: set[str] = set()
        last = ""
        for _ in range(self.send_retries if to is None else 1):
            peer = to or await self.directory.pick(stage, exclude=tried)
            try:
                reply = await self.link.request(peer, kind, body)
            except Exception as e:  # transport failures of any kind: try another peer
                last = str(e)
                self.directory.report_failure(peer)
                tried.add(peer)
                continue
            if reply == ACK:
                self.sent_tokens[kind] += tokens
                return
            try:
                err = decode_message(reply, self._limits())
                last = err.reason if isinstance(err, ErrorReply) else "an unexpected reply"
            except WireError as e:
                last = f"an unreadable reply ({e})"
            tried.add(peer)
        raise LinkError(f"stage {self.stage} could not deliver a '{kind}' message to stage {stage}: {last}")

    # ------------------------------------------------------------------ inbound
    async def _admit(self, step: int, sender: str) -> str | None:
        """Wait for a message of a future step until this stage reaches it; refuse past steps."""
        if step > self.runner.step + 1:
            return f"step {step} is more than one step ahead of this stage's step {self.runner.step}."
        deadline = time.monotonic() + self.future_step_wait
        while step > self.runner.step:
            if time.monotonic() > deadline:
                return f"step {step} is ahead of this stage's step {self.runner.step} for too long."
            self._step_changed.clear()
            try:
                await asyncio.wait_for(self._step_changed.wait(), timeout=max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass
        if step < self.runner.step:
            return f"step {step} is already finished here (this stage is on step {self.runner.step})."
        return None

    def _stepped(self) -> None:
        self._step_changed.set()

    async def _on_activation(self, body: bytes, sender: str) -> bytes:
        try:
            msg = decode_message(body, self._limits())
        except WireError as e:
            return self._refuse(str(e), sender)
        if not isinstance(msg, ActivationMessage):
            return self._refuse("the forward handler takes activation messages only.", sender)
        h = msg.header
        if h.stage != self.stage:
            return self._refuse(f"this peer serves stage {self.stage}, not {h.stage}.", sender)
        problem = await self._admit(h.step, sender)
        if problem:
            return self._refuse(problem, sender)
        if not 0 <= h.microbatch < self.spec.n_microbatches or h.microbatch in self._upstream:
            return self._refuse(f"microbatch {h.microbatch} of step {h.step} is unknown or already here.", sender)
        self._upstream[h.microbatch] = (sender, msg.tokens)
        z = self.packer.unpack(msg.payload, self.runner.dtype)
        self._spawn(self._process_activation(h, msg.tokens, z, sender))
        return ACK

    async def _process_activation(self, h: Header, tokens: torch.Tensor, z: torch.Tensor, sender: str) -> None:
        if self.runner.is_last:
            loss, grad, stepped = await self._run(self._tail_job, h.step, h.microbatch, tokens, z)
            self.last_loss = loss
            self._upstream.pop(h.microbatch, None)
            if stepped:
                self._stepped()
            body = encode_message(GradientMessage(self._header(h.step, h.microbatch, self.stage - 1),
                                                  self.packer.pack(grad), loss))
            await self._send(self.stage - 1, KIND_BACKWARD, body, grad.shape[0] * grad.shape[1], to=sender)
            return
        out = await self._run(self.runner.forward, h.step, h.microbatch, tokens, z)
        body = encode_message(ActivationMessage(self._header(h.step, h.microbatch, self.stage + 1),
                                                tokens_for_wire(tokens, self.spec.vocab), self.packer.pack(out)))
        await self._send(self.stage + 1, KIND_FORWARD, body, out.shape[0] * out.shape[1])

    def _tail_job(self, step: int, mb: int, tokens: torch.Tensor, z: torch.Tensor):
        loss, grad = self.runner.forward_backward(step, mb, tokens, z)
        stepped = False
        if self.runner.step_ready():
            self.runner.optimizer_step()
            stepped = True
        return loss, grad, stepped

    def _backward_job(self, step: int, mb: int, grad: torch.Tensor):
        g_in = self.runner.backward(step, mb, grad)
        stepped = False
        if self.runner.step_ready() and not self.runner.is_first:
            self.runner.optimizer_step()
            stepped = True
        return g_in, stepped

    async def _on_gradient(self, body: bytes, sender: str) -> bytes:
        try:
            msg = decode_message(body, self._limits())
        except WireError as e:
            return self._refuse(str(e), sender)
        if not isinstance(msg, GradientMessage):
            return self._refuse("the backward handler takes gradient messages only.", sender)
        h = msg.header
        if h.stage != self.stage:
            return self._refuse(f"this peer serves stage {self.stage}, not {h.stage}.", sender)
        if h.step != self.runner.step:
            return self._refuse(f"gradient for step {h.step}, but this stage is on step {self.runner.step}.", sender)
        pending = self.runner.pending_shape(h.microbatch)
        if pending is None:
            return self._refuse(f"no forward pass is waiting for microbatch {h.microbatch} of step {h.step}.", sender)
        if tuple(msg.payload.values.shape) != pending:
            return self._refuse(f"gradient shape {list(msg.payload.values.shape)} does not match the activation "
                                f"{list(pending)}.", sender)
        grad = self.packer.unpack(msg.payload, self.runner.dtype)
        self._spawn(self._process_gradient(h, grad, msg.loss))
        return ACK

    async def _process_gradient(self, h: Header, grad: torch.Tensor, loss: float) -> None:
        g_in, stepped = await self._run(self._backward_job, h.step, h.microbatch, grad)
        if stepped:
            self._stepped()
        if self.runner.is_first:
            fut = self._waiting.get(h.microbatch)
            if fut is not None and not fut.done():
                fut.set_result(loss)
            return
        sender, _ = self._upstream.pop(h.microbatch)
        body = encode_message(GradientMessage(self._header(h.step, h.microbatch, self.stage - 1),
                                              self.packer.pack(g_in), loss))
        await self._send(self.stage - 1, KIND_BACKWARD, body, g_in.shape[0] * g_in.shape[1], to=sender)

    # ------------------------------------------------------------------ the head's loop
    async def train_step(self) -> StepLog:
        """Head only: run one synchronous step over this head's microbatches."""
        if not self.runner.is_first or self.batches is None:
            raise RuntimeError("only a head peer with a data source drives steps.")
        step, t0 = self.runner.step, time.perf_counter()
        loop = asyncio.get_running_loop()
        self._waiting = {mb: loop.create_future() for mb in self.microbatches}
        sends = []
        tokens_total = 0
        for mb in self.microbatches:
            tokens = self.batches(step, mb)
            tokens_total += tokens.shape[0] * self.spec.seq_len
            out = await self._run(self.runner.forward, step, mb, tokens, None)
            body = encode_message(ActivationMessage(self._header(step, mb, 1), tokens_for_wire(tokens, self.spec.vocab),
                                                    self.packer.pack(out)))
            sends.append(asyncio.create_task(self._send(1, KIND_FORWARD, body, out.shape[0] * out.shape[1])))
        try:
            await asyncio.wait_for(asyncio.gather(*sends), timeout=self.step_timeout)
            losses = await asyncio.wait_for(asyncio.gather(*self._waiting.values()), timeout=self.step_timeout)
        except asyncio.TimeoutError:
            for t in sends:
                t.cancel()
            await self._run(self.runner.abort_step)
            raise StepFailed(f"step {step + 1} got no gradients back within {self.step_timeout:g} s; "
                             f"check that every stage has a live peer (`swarm status`).") from None
        except LinkError as e:
            await self._run(self.runner.abort_step)
            raise StepFailed(f"step {step + 1} failed: {e}") from None
        record = await self._run(self.runner.optimizer_step)
        seconds = time.perf_counter() - t0
        self.tokens_done += tokens_total
        self.throughput = tokens_total / max(seconds, 1e-9)
        self.last_loss = sum(losses) / len(losses)
        return StepLog(step + 1, self.last_loss, tokens_total, seconds, self.runner.basis_version, record.lr)


def _log_task_error(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        e = task.exception()
        level = logging.WARNING if isinstance(e, (LinkError, StageError)) else logging.ERROR
        log.log(level, "background work failed: %s", e, exc_info=level == logging.ERROR)
