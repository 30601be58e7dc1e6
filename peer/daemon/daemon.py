"""`StageDaemon`: the asyncio service around a StageRunner: what a head, middle or tail does
with the microbatches of a step (docs/design.md section 3).

The head's step driver (`peer/step/driver.py`) runs forward on each microbatch and sends the
boundary tensor on (`start_microbatch`); a middle peer decodes, runs forward and forwards to
a replica of the next stage picked by the router; the tail computes the loss, runs backward
and returns the compressed gradient to whoever sent the activation, and so on back to the
head. Nobody steps its optimizer here: once every gradient is back, the driver has each
stage's replicas reduce and apply (`peer/commit/commit.py`).

Every message names its step and the driver's attempt at it. A newer attempt of the step in
progress means the older one failed: its partial work is dropped before the new one starts.
Inbound messages are validated (wire.py, then step, attempt and microbatch checks) before
they are acknowledged; a refusal is an `ErrorReply`, and refused messages never touch the
runner's state. Accepted work runs on one worker thread, in order, never on the event loop.
The handlers of inbound messages are in `peer/daemon/inbound.py`; delivery to other peers (router
picks, retries) in `peer/daemon/delivery.py`; sending a microbatch on with its deadline (a replica
that holds it longer is banned and the microbatch goes to another one at once) in
`peer/daemon/microbatch_forward.py`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from peer.runner.stage import StageError, StageRunner
from protocol.basis_update import BasisUpdate, StatsMessage
from protocol.codecs import WirePacker, WireTensors
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_BASIS,
    KIND_GRADIENT,
    ErrorReply,
    Header,
    WireLimits,
    encode_activation,
    encode_gradient,
    encode_message,
)

from .basis_gate import BasisGate
from .boundary_log import BoundaryLog
from .delivery import Courier
from .inbound import SKIPPED, InboundHandlers
from .interfaces import Admit, LinkError, MessageLink, PeerDirectory, PeerStatus
from .microbatch_forward import DEADLINE_FLOOR_S, MicrobatchForwarding
from .norm_band import NormBand

log = logging.getLogger(__name__)



class StageDaemon(InboundHandlers, MicrobatchForwarding):
    def __init__(self, runner: StageRunner, link: MessageLink, directory: PeerDirectory, *,
                 send_retries: int = 3, future_step_wait: float = 10.0,
                 on_refit: Callable[[StatsMessage], Awaitable[None]] | None = None,
                 verify_update: Callable[[BasisUpdate], bool] | None = None,
                 pull_updates: Callable[[], Awaitable[None]] | None = None, basis_wait: float = 30.0,
                 admit: Admit | None = None, deadline_floor: float = DEADLINE_FLOOR_S) -> None:
        self.runner, self.link, self.directory = runner, link, directory
        self.spec = runner.spec
        self.stage = runner.stage
        self.peer_id = link.peer_id
        self.packer = WirePacker.for_spec(self.spec)
        self.future_step_wait = future_step_wait
        self.on_refit, self.basis_wait = on_refit, basis_wait
        self.courier = Courier(link, directory, self.stage, self._limits, send_retries=send_retries,
                               basis_wait=basis_wait)
        self.sent_tokens = self.courier.sent_tokens  # tokens per kind, for bytes-per-token
        # (sender, kind) -> why that sender may not send this kind of message here, or None
        self.admit = admit
        self.bands = {KIND_ACTIVATION: NormBand(), KIND_GRADIENT: NormBand()}
        self.boundary = BoundaryLog()  # the attempt's boundary messages: what a spot check recomputes from
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage{self.stage}")
        self.gate = BasisGate(runner, self.run, verify_update=verify_update, pull_updates=pull_updates,
                              wait=basis_wait)
        self.attempt = 0  # the driver's attempt at the step in progress that this stage works for
        # an optimizer step runs on the worker: runner.step has moved there before stepped() runs here
        self.stepping = False
        self._upstream: dict[int, tuple[str, torch.Tensor]] = {}  # microbatch -> (sender, tokens)
        self._downstream: dict[int, tuple[str, float]] = {}  # microbatch -> (next-stage peer, time sent)
        self._replies: dict[int, asyncio.Future] = {}  # microbatch -> done when its gradient is back here
        self._round_trip: float | None = None  # EWMA of a microbatch's round trip to the next stage and back
        self.deadline_floor = deadline_floor
        self.missed_deadlines = 0  # microbatches re-sent because a replica held one past its deadline
        self._returned: set[str] = set()  # next-stage replicas that have returned a gradient here
        # microbatch -> the peer whose gradient for it this attempt took: a repeat of that gradient
        # (its reply was lost) may arrive while the backward still runs, and is a duplicate
        self._gradient_taken: dict[int, str] = {}
        self.waiting: dict[int, asyncio.Future] = {}  # head: microbatch -> future of its loss
        self._step_changed = asyncio.Event()
        self._window: deque[tuple[float, int]] = deque()
        self._tasks: set[asyncio.Task] = set()
        self.state = "online"
        self.leads = False  # set by the head's driver while it drives the steps
        # stage 1: ((step, attempt), leader, heads) of the leader's last "work" command (peer/commit/head_work.py)
        self.feeders: tuple[tuple[int, int], str, frozenset[str]] | None = None
        self.refused = 0
        self.tokens_done = 0
        self.worker_busy_s = 0.0  # seconds the worker thread spent in jobs (compute, packing, optimizer steps)
        self.throughput = 0.0
        self.last_loss = float("nan")

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        if not self.runner.is_first:
            await self.link.serve(KIND_ACTIVATION, self._on_activation)
        if not self.runner.is_last:
            await self.link.serve(KIND_GRADIENT, self._on_gradient)
        if self.runner.basis is not None:
            await self.link.serve(KIND_BASIS, self._on_basis)

    def status(self, state: str | None = None) -> PeerStatus:
        extra = {"loss": self.last_loss, "refused": self.refused}
        return PeerStatus(self.stage, state or self.state, self.throughput, len(self._upstream),
                          self.runner.basis_version, self.runner.step, self.leads, extra)

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

    async def run(self, fn, *args):
        """Run `fn(*args)` on the stage's worker thread, after everything queued before it."""
        def timed_job():
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:  # one worker thread: no other job writes the sum meanwhile
                self.worker_busy_s += time.perf_counter() - t0
        return await asyncio.get_running_loop().run_in_executor(self._worker, timed_job)

    async def run_step(self, fn, *args):
        """`run` for a job that takes the optimizer step (moves runner.step); the caller calls `stepped()`
        when it returns. Meanwhile a message of the next step waits in `_admit`: seen between the
        worker's `step += 1` and `stepped()`, it would meet the old step's attempt and be refused."""
        self.stepping = True
        try:
            return await self.run(fn, *args)
        finally:
            self.stepping = False
            self._step_changed.set()

    async def run_for(self, h: Header, fn, *args):
        """`run`, but skipped (returns SKIPPED) if by the time the worker gets to it the attempt of
        `h` was aborted: an abort is queued behind work already queued, so nothing of an aborted
        attempt survives it, and nothing queued after it starts."""
        def job():
            return fn(*args) if self.current(h) else SKIPPED
        return await self.run(job)

    def spawn(self, coro) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_task_error)

    def _limits(self) -> WireLimits:
        return WireLimits.for_spec(self.spec, self.runner.basis_version, accept_next_basis=True)

    def header(self, h: Header, to_stage: int) -> Header:
        """The header of what this stage sends on for the message `h` (same step, microbatch, attempt)."""
        return Header(self.spec.run_hash, h.step, h.microbatch, self.runner.version_for_step(h.step), self.spec.codec,
                      to_stage, h.attempt)

    def current(self, h: Header) -> bool:
        """Whether work for `h` still belongs to the step and attempt in progress (it may have been aborted)."""
        return h.step == self.runner.step and h.attempt == self.attempt

    def refuse(self, reason: str, sender: str, code: str = "refused") -> bytes:
        self.refused += 1
        log.warning("stage %d refused a message from %s: %s", self.stage, sender[-8:], reason)
        return encode_message(ErrorReply(reason, code))

    # ------------------------------------------------------------------ steps and attempts
    def stepped(self) -> None:
        """The runner finished a step: the next one starts at attempt 0 with nothing in flight."""
        self.attempt = 0
        self._forget_flight()
        self._step_changed.set()

    def _forget_flight(self) -> None:
        for peer, _ in self._downstream.values():
            self.directory.release(peer, None)
        self._downstream.clear()
        for mb in list(self._replies):
            self._answered(mb, None)
        self._gradient_taken.clear()
        self._upstream.clear()
        for fut in self.waiting.values():
            if not fut.done():
                fut.cancel()
        self.waiting.clear()

    async def adopt_attempt(self, attempt: int) -> None:
        """A newer attempt at the step in progress: the older one failed; drop its partial work
        (queued on the worker, so it runs before anything of the new attempt)."""
        if attempt <= self.attempt:
            return
        log.info("stage %d: attempt %d of step %d supersedes attempt %d", self.stage, attempt, self.runner.step + 1,
                 self.attempt)
        self.attempt = attempt
        self._forget_flight()
        await self.run(self.runner.abort_step)

    async def until_step(self, step: int) -> None:
        """Hold a message or command of the next step (at most `future_step_wait` s) while this stage has yet
        to apply the current one: the leader tells the replicas to apply a step while the next one starts, on
        streams of their own, so its apply may reach a replica after the next step's first messages (a
        reduce command, say, to a replica that got no microbatch of that step)."""
        if step == self.runner.step + 1 or self.stepping:
            deadline = time.monotonic() + self.future_step_wait
            while (step > self.runner.step or self.stepping) and time.monotonic() < deadline:
                self._step_changed.clear()
                try:
                    await asyncio.wait_for(self._step_changed.wait(), timeout=max(0.01, deadline - time.monotonic()))
                except TimeoutError:
                    pass

    async def _admit(self, h: Header, sender: str) -> tuple[str, str] | None:
        """(reason, code) to refuse a message that is not for this stage's step and attempt in
        progress. A message of the next step waits (bounded) while this stage applies the
        current one. Refusals say which rule failed, never which step this stage is on."""
        await self.until_step(h.step)
        if h.step < self.runner.step:
            return "the message is for a step already finished here.", "duplicate"
        if h.step != self.runner.step:
            return "the message is not for the step in progress here.", "refused"
        if h.attempt < self.attempt:
            return "the message belongs to an attempt that was superseded.", "stale"
        if h.attempt > self.attempt:
            # the driver started a new attempt (its abort may not have reached this peer): follow it. Only
            # heads the leader named may send stage 1 activations, and only its attempts travel downstream.
            await self.adopt_attempt(h.attempt)
        return None

    async def admitted(self, sender: str, kind: str) -> bytes | None:
        """A refusal unless `sender` may send this kind of message to this stage."""
        if self.admit is None:
            return None
        problem = await self.admit(sender, kind)
        return self.refuse(problem.reason, sender, code=problem.code) if problem else None

    async def payload_rms(self, payload: WireTensors) -> float:
        """The RMS of a payload's values, worked out on the host in a thread (widened once, straight to
        the float64 the RMS sums in). Not on the accelerator: a copy there from the event loop waits for
        the compute the worker has queued, and every message would stall the loop for a job's length
        (GPU stages idled ~30%)."""
        return await asyncio.to_thread(lambda: NormBand.rms(self.packer.unpack(payload, torch.float64)))

    def on_device(self, payload: WireTensors) -> torch.Tensor:
        """Worker thread: a payload as the tensor this stage computes with."""
        return self.packer.unpack(payload, self.runner.dtype, self.runner.device)

    def _out_of_band(self, kind: str, rms: float, sender: str, scale: float = 1.0) -> bytes | None:
        """A refusal (and a ban of the sender) if the payload's size `rms` (over the loss scale of a
        gradient in an fp16 run) is far from what this stage receives."""
        problem = self.bands[kind].judge(rms / scale)
        if problem is None:
            return None
        self.directory.report_failure(sender, bad_data=True)
        return self.refuse(f"the payload is refused: {problem}", sender)

    def _check_version(self, h: Header, sender: str) -> bytes | None:
        """A refusal unless the message's basis version is the one this stage uses for its step."""
        problem = self.gate.check(h)
        if problem is None:
            return None
        reason, code = problem
        if code == "retry" and self.gate.pull_updates is not None:
            self.spawn(self.gate.pull_updates())
        return self.refuse(reason, sender, code=code)

    def _forward_job(self, h: Header, tokens: torch.Tensor, z: WireTensors | None) -> tuple[bytes, int]:
        """Worker thread: forward (of the previous stage's activation `z`; none at a head), and the bytes
        of the activation for the next stage (packing waits for the device, so it stays off the event loop)."""
        out = self.runner.forward(h.step, h.microbatch, tokens, None if z is None else self.on_device(z))
        body = encode_activation(self.header(h, self.stage + 1), tokens, self.packer.pack(out), self.spec.vocab)
        return body, out.shape[0] * out.shape[1]

    def _gradient_job(self, h: Header, fn, *args) -> tuple[bytes, int, float]:
        """Worker thread: a backward (`fn`), and the bytes of the gradient for the previous stage."""
        loss, grad = fn(*args)
        if grad is None:
            return b"", 0, loss
        grad, overflow = self.runner.boundary_gradient(h.microbatch, grad)  # fp16: an overflow travels as a flag
        body = encode_gradient(self.header(h, self.stage - 1), self.packer.pack(grad), loss, overflow)
        return body, grad.shape[0] * grad.shape[1], loss

    def _tail_job(self, h: Header, tokens: torch.Tensor, z: WireTensors | None):
        z = None if z is None else self.on_device(z)
        return self._gradient_job(h, self.runner.forward_backward, h.step, h.microbatch, tokens, z)

    def _backward_job(self, h: Header, payload: WireTensors, loss: float, overflow: bool = False):
        """Worker thread: the backward of the next stage's gradient; an fp16 overflow is taken as zeros,
        neither judged nor learnt from (peer/runner/loss_scaling.py)."""
        grad = self.on_device(payload)
        if overflow:
            grad = torch.zeros_like(grad)
        return self._gradient_job(h, lambda: (loss, self.runner.backward(h.step, h.microbatch, grad, overflow)))

    # ------------------------------------------------------------------ the head's share
    async def start_microbatch(self, step: int, mb: int, tokens: torch.Tensor) -> asyncio.Future:
        """Head: forward one microbatch of the current attempt and send it on; the future gets
        its loss once its gradient is back through this stage."""
        if not self.runner.is_first:
            raise RuntimeError("only a head peer starts microbatches.")
        fut = asyncio.get_running_loop().create_future()
        h = Header(self.spec.run_hash, step, mb, self.runner.version_for_step(step), self.spec.codec, 0, self.attempt)
        if self.runner.is_last:  # one stage (pure data parallel): the head is the whole model, nothing to send
            _, _, loss = await self.run(self._tail_job, h, tokens, None)
            fut.set_result(loss)
            return fut
        self.waiting[mb] = fut
        body, ntokens = await self.run(self._forward_job, h, tokens, None)
        self.spawn(self._forward_or_fail(h, body, ntokens, fut))
        return fut

    async def _forward_or_fail(self, h: Header, body: bytes, ntokens: int, fut: asyncio.Future) -> None:
        try:
            await self._forward(h, body, ntokens)
        except LinkError as e:
            if not fut.done():
                fut.set_exception(e)

    # ------------------------------------------------------------------ basis updates
    async def accept_update(self, update: BasisUpdate) -> str | None:
        """Take a basis update (pushed, or pulled from the DHT), or say why not."""
        return await self.gate.accept(update)

    def refit_statistic(self) -> StatsMessage | None:
        """Right after a step that ends a basis interval: this stage's statistic for the coordinator."""
        if not self.runner.refit_due():
            return None
        return StatsMessage(self.spec.run_hash, self.stage, self.runner.basis_version, self.runner.step,
                            self.runner.refit_statistic())


def _log_task_error(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        e = task.exception()
        level = logging.WARNING if isinstance(e, (LinkError, StageError)) else logging.ERROR
        log.log(level, "background work failed: %s", e, exc_info=level == logging.ERROR)
