"""`StageDaemon`: the asyncio service around a StageRunner; what a head, middle or tail does.

Message flow (docs/design.md section 3). The head drives each step: it runs forward on its
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
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from protocol.basis_update import BasisUpdate, StatsMessage, decode_update
from protocol.codecs import WirePacker
from protocol.wire import (
    ActivationMessage,
    ErrorReply,
    GradientMessage,
    Header,
    WireError,
    WireLimits,
    decode_message,
    encode_message,
    tokens_for_wire,
)

from .basis_gate import BasisGate
from .interfaces import LinkError, MessageLink, PeerDirectory, PeerStatus
from .stage import StageError, StageRunner

log = logging.getLogger(__name__)

KIND_FORWARD, KIND_BACKWARD, KIND_BASIS = "act", "grad", "basis"
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
                 send_retries: int = 3, future_step_wait: float = 30.0,
                 on_refit: Callable[[StatsMessage], Awaitable[None]] | None = None,
                 verify_update: Callable[[BasisUpdate], bool] | None = None,
                 pull_updates: Callable[[], Awaitable[None]] | None = None, basis_wait: float = 30.0) -> None:
        self.runner, self.link, self.directory = runner, link, directory
        self.spec = runner.spec
        self.stage = runner.stage
        self.packer = WirePacker.for_spec(self.spec)
        self.batches = batches
        self.microbatches = microbatches if microbatches is not None else list(range(self.spec.n_microbatches))
        self.step_timeout, self.send_retries, self.future_step_wait = step_timeout, send_retries, future_step_wait
        self.on_refit, self.basis_wait = on_refit, basis_wait
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage{self.stage}")
        self.gate = BasisGate(runner, self._run, verify_update=verify_update, pull_updates=pull_updates,
                              wait=basis_wait)
        self._upstream: dict[int, tuple[str, torch.Tensor]] = {}  # microbatch -> (sender, tokens)
        self._waiting: dict[int, asyncio.Future] = {}  # head: microbatch -> future of its loss
        self._step_changed = asyncio.Event()
        self._retries: dict[str, int] = {}
        self._window: deque[tuple[float, int]] = deque()
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
        if self.runner.basis is not None:
            await self.link.serve(KIND_BASIS, self._on_basis)
        await self.directory.announce(self.status("online"))

    def status(self, state: str = "online") -> PeerStatus:
        return PeerStatus(self.stage, state, self.throughput, len(self._upstream), self.runner.basis_version,
                          self.runner.step, {"loss": self.last_loss, "refused": self.refused})

    async def drain(self, timeout: float = 2.0) -> None:
        """Give work in flight (sends waiting for a confirmation, say) a moment to finish."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout)

    async def stop(self) -> None:
        await self.drain()
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
        return WireLimits.for_spec(self.spec, self.runner.basis_version, accept_next_basis=True)

    def _check_version(self, h: Header, sender: str) -> bytes | None:
        """A refusal unless the message's basis version is the one this stage uses for its step."""
        problem = self.gate.check(h)
        if problem is None:
            return None
        reason, code = problem
        if code == "retry" and self.gate.pull_updates is not None:
            self._spawn(self.gate.pull_updates())
        return self._refuse(reason, sender, code=code)

    def _header(self, step: int, mb: int, to_stage: int) -> Header:
        return Header(self.spec.run_hash, step, mb, self.runner.version_for_step(step), self.spec.codec, to_stage)

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
            outcome, last = await self._deliver(peer, kind, body)
            if outcome == "ok":
                self.sent_tokens[kind] += tokens
                self._retries.pop(peer, None)
                return
            if outcome == "retry" and await self._retry_later(peer, kind):
                return await self._send(stage, kind, body, tokens, to=peer)
            tried.add(peer)
        raise LinkError(f"stage {self.stage} could not deliver a '{kind}' message to stage {stage}: {last}")

    async def _deliver(self, peer: str, kind: str, body: bytes) -> tuple[str, str]:
        """One message to one peer: ("ok" | "retry" | "failed", why).

        A transport failure can hide a message that arrived but whose reply was lost, so the
        same peer is asked once more; a "duplicate" refusal then means the first one arrived.
        """
        last = ""
        for attempt in range(2):
            try:
                reply = await self.link.request(peer, kind, body)
            except Exception as e:  # transport failures of any kind
                last = str(e)
                if attempt == 0:
                    await asyncio.sleep(0.2)  # a short pause before asking the same peer again
                    continue
                self.directory.report_failure(peer)
                return "failed", last
            if reply == ACK:
                return "ok", ""
            try:
                err = decode_message(reply, self._limits())
            except WireError as e:
                return "failed", f"an unreadable reply ({e})"
            if not isinstance(err, ErrorReply):
                return "failed", "an unexpected reply"
            if err.code == "duplicate" and attempt == 1:
                return "ok", ""
            return ("retry" if err.code == "retry" else "failed"), err.reason
        return "failed", last

    async def _retry_later(self, peer: str, kind: str) -> bool:
        """The receiver asked to retry (it is fetching a basis update): wait a little, bounded."""
        n = self._retries.get(peer, 0)
        if n * 0.2 > self.basis_wait:
            return False
        self._retries[peer] = n + 1
        await asyncio.sleep(0.2)  # back-off before re-sending to a peer that asked for it
        return True

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
            # a message of a past step can only be a repeat (its reply was lost): say so
            return self._refuse(problem, sender, code="duplicate" if h.step < self.runner.step else "refused")
        refusal = self._check_version(h, sender)
        if refusal is not None:
            return refusal
        if not 0 <= h.microbatch < self.spec.n_microbatches:
            return self._refuse(f"microbatch {h.microbatch} is outside 0..{self.spec.n_microbatches - 1}.", sender)
        if h.microbatch in self._upstream or self.runner.has_seen(h.microbatch):
            return self._refuse(f"microbatch {h.microbatch} of step {h.step} is already here.", sender,
                                code="duplicate")
        self._upstream[h.microbatch] = (sender, msg.tokens)
        z = self.packer.unpack(msg.payload, self.runner.dtype)
        self._spawn(self._process_activation(h, msg.tokens, z, sender))
        return ACK

    def _note_tokens(self, n: int) -> None:
        """Throughput of a non-head stage: tokens through forward over the last ~10 s."""
        now = time.monotonic()
        self._window.append((now, n))
        while self._window and now - self._window[0][0] > 10.0:
            self._window.popleft()
        span = max(now - self._window[0][0], 1.0)
        self.throughput = sum(k for _, k in self._window) / span
        self.tokens_done += n

    async def _process_activation(self, h: Header, tokens: torch.Tensor, z: torch.Tensor, sender: str) -> None:
        self._note_tokens(z.shape[0] * z.shape[1])
        if self.runner.is_last:
            loss, grad, stats = await self._run(self._tail_job, h.step, h.microbatch, tokens, z)
            self.last_loss = loss
            self._upstream.pop(h.microbatch, None)
            self._after_step(stats)
            body = encode_message(GradientMessage(self._header(h.step, h.microbatch, self.stage - 1),
                                                  self.packer.pack(grad), loss))
            await self._send(self.stage - 1, KIND_BACKWARD, body, grad.shape[0] * grad.shape[1], to=sender)
            return
        out = await self._run(self.runner.forward, h.step, h.microbatch, tokens, z)
        body = encode_message(ActivationMessage(self._header(h.step, h.microbatch, self.stage + 1),
                                                tokens_for_wire(tokens, self.spec.vocab), self.packer.pack(out)))
        await self._send(self.stage + 1, KIND_FORWARD, body, out.shape[0] * out.shape[1])

    def _step_and_refit(self) -> StatsMessage | None:
        """Optimizer step; at the end of a basis interval, the statistic to send to the coordinator."""
        self.runner.optimizer_step()
        if not self.runner.refit_due():
            return None
        return StatsMessage(self.spec.run_hash, self.stage, self.runner.basis_version, self.runner.step,
                            self.runner.refit_statistic())

    def _tail_job(self, step: int, mb: int, tokens: torch.Tensor, z: torch.Tensor):
        loss, grad = self.runner.forward_backward(step, mb, tokens, z)
        stats = self._step_and_refit() if self.runner.step_ready() else False
        return loss, grad, stats

    def _backward_job(self, step: int, mb: int, grad: torch.Tensor):
        g_in = self.runner.backward(step, mb, grad)
        stats = False
        if self.runner.step_ready() and not self.runner.is_first:
            stats = self._step_and_refit()
        return g_in, stats

    def _after_step(self, stats: StatsMessage | None | bool) -> None:
        if stats is False:
            return
        self._stepped()
        if isinstance(stats, StatsMessage) and self.on_refit is not None:
            self._spawn(self.on_refit(stats))

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
            return self._refuse(f"gradient for step {h.step}, but this stage is on step {self.runner.step}.", sender,
                                code="duplicate" if h.step < self.runner.step else "refused")
        refusal = self._check_version(h, sender)
        if refusal is not None:
            return refusal
        pending = self.runner.pending_shape(h.microbatch)
        if pending is None:
            if self.runner.has_seen(h.microbatch):
                return self._refuse(f"the gradient of microbatch {h.microbatch} of step {h.step} was already "
                                    f"applied.", sender, code="duplicate")
            return self._refuse(f"no forward pass is waiting for microbatch {h.microbatch} of step {h.step}.", sender)
        if tuple(msg.payload.values.shape) != pending:
            return self._refuse(f"gradient shape {list(msg.payload.values.shape)} does not match the activation "
                                f"{list(pending)}.", sender)
        grad = self.packer.unpack(msg.payload, self.runner.dtype)
        self._spawn(self._process_gradient(h, grad, msg.loss))
        return ACK

    async def _process_gradient(self, h: Header, grad: torch.Tensor, loss: float) -> None:
        g_in, stats = await self._run(self._backward_job, h.step, h.microbatch, grad)
        self._after_step(stats)
        if self.runner.is_first:
            fut = self._waiting.get(h.microbatch)
            if fut is not None and not fut.done():
                fut.set_result(loss)
            return
        sender, _ = self._upstream.pop(h.microbatch)
        body = encode_message(GradientMessage(self._header(h.step, h.microbatch, self.stage - 1),
                                              self.packer.pack(g_in), loss))
        await self._send(self.stage - 1, KIND_BACKWARD, body, g_in.shape[0] * g_in.shape[1], to=sender)

    async def _on_basis(self, body: bytes, sender: str) -> bytes:
        try:
            update = decode_update(body, self.spec)
        except WireError as e:
            return self._refuse(str(e), sender)
        problem = await self.accept_update(update)
        return self._refuse(problem, sender) if problem else ACK

    async def accept_update(self, update: BasisUpdate) -> str | None:
        """Take a basis update (pushed, or pulled from the DHT), or say why not."""
        return await self.gate.accept(update)

    # ------------------------------------------------------------------ the head's loop
    async def train_step(self) -> StepLog:
        """Head only: run one synchronous step over this head's microbatches."""
        if not self.runner.is_first or self.batches is None:
            raise RuntimeError("only a head peer with a data source drives steps.")
        step, t0 = self.runner.step, time.perf_counter()
        await self.gate.wait_for_switch(step)
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
        return StepLog(step + 1, self.last_loss, tokens_total, seconds, self.runner.version_for_step(step), record.lr)


def _log_task_error(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        e = task.exception()
        level = logging.WARNING if isinstance(e, (LinkError, StageError)) else logging.ERROR
        log.log(level, "background work failed: %s", e, exc_info=level == logging.ERROR)
