"""`ShareCheck`: a replica's side of spot checks (issue 21; the leader's side is peer/checks/spot_checks.py).

Checking (the leader's "check" command, protocol/spot_check.py `CheckOrder`): ask the replica
checked for the boundary messages of its microbatches, refuse any whose digest differs from what
their senders reported, recompute its share from this replica's own state (the same state: the
replicas of a stage are bit-identical), and compare with the contribution it sent in the reduce:

    share = sum over its microbatches m of dL_m/dtheta, packed in the stage's SyncLayout
    agree  <=>  ||share_recomputed - share_sent|| <= tol x max(||share_recomputed||, tiny)

tol (`TOLERANCE`) is per compute dtype of the run spec (a bf16 or fp16 run keeps fp32 weights and
gradients, but its matmuls round in bf16/fp16): the replicas compute each microbatch with the same
kernels and differ only in the order their microbatches were added, so fp64 agrees to ~1e-15 and
fp32 to ~1e-7 (the bounds leave 1e6 and 1e3 of room). bf16, measured (`swarm bench share-tolerance
--device cuda`, one H200, presets tiny and small, codecs subspace and dense, 40 shares;
docs/security.md, docs/img/share-tolerance-h200.json): on one card a replica's share and its
recomputation are equal bit for bit; with other kernels (the math attention kernel, cuBLAS's bf16
reduction flipped: the stand-in for another GPU model, which was not measured) they differ by at
most 3.5e-3, against the CPU's bf16 kernels 3.3e-3, against fp32 5.8e-3. The 2e-2 leaves 5.8x
room over the worst same-dtype pair and sits 17x below the smallest lie measured (another share's
gradient, 0.35; random numbers of the honest norm ~1.41, x -50 = 51). fp16 (3 more mantissa bits
than bf16; not measured) keeps the same bound. A lie the size of the share's own rounding noise passes.
torch.compile's fused kernels round elsewhere than the eager ones: 2.8% between a compiled and an eager `large`
bf16 gradient (one H100, docs/results/peer_compile_h100_20261206), 0.29% between two compiled copies; so
compiling is the run's choice (`compile_blocks` in its spec), never one replica's.

A head's share (stage 0; peer/commit/head_work.py) is checked by another head: its input, the tokens,
the checker regenerates from (seed, step, index) and never takes from the head checked; what it
fetches is the activation the head sent (digest reported by the stage-1 replica that received it)
and the gradient that came back (digest reported by its sender). The activation must carry those
tokens and equal the recomputed forward's within the tolerance below (a head that sends stage 1
other numbers than its state gives is caught like one that lies in the reduce), and the share is
recomputed as any stage's.

Serving: the inputs of this replica's own share, to a checker of the same stage.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from peer.daemon.daemon import StageDaemon
from peer.daemon.transfer_time import TransferWait, boundary_bytes
from peer.runner.stage import StageRunner
from protocol.codecs import WirePacker
from protocol.control import Command, Contribution
from protocol.model import lm_loss
from protocol.spec import COMPUTE_DTYPES
from protocol.spot_check import (
    CheckOrder,
    InputsRequest,
    decode_inputs_reply,
    decode_order,
    digest,
    encode_inputs_reply,
    encode_inputs_request,
)
from protocol.wire import (
    KIND_REDUCE,
    ActivationMessage,
    ErrorReply,
    GradientMessage,
    WireError,
    WireLimits,
    decode_message,
)

log = logging.getLogger(__name__)

# per the run spec's compute dtype; bf16's measured against other kernels and lies (module docstring)
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}


def recompute_share(daemon: StageDaemon, bodies: list[tuple[bytes, bytes | None]]) -> torch.Tensor:
    """Worker thread: the flat gradient sum (SyncLayout, CPU) of the microbatches whose boundary
    messages are `bodies`, from this replica's state; nothing of its own step is touched."""
    return share_from_inputs(daemon.runner, daemon.packer, daemon._limits(), bodies)


def share_from_inputs(runner: StageRunner, packer: WirePacker, limits: WireLimits,
                      bodies: list[tuple[bytes, bytes | None]]) -> torch.Tensor:
    """`recompute_share` on any runner holding the stage's state (swarm/bench/replicas/share_tolerance.py
    runs it on other devices and dtypes): sum over the microbatches of dL_m/dtheta, packed."""
    total = [torch.zeros_like(p) for p in runner.params]
    scale = runner.loss_scale.scale if runner.loss_scale is not None else 1.0
    for act, grad in bodies:
        am = decode_message(act, limits)
        if not isinstance(am, ActivationMessage):
            raise WireError("an input is not an activation message.")
        tokens = am.tokens.to(runner.device)
        out = runner.output(tokens, packer.unpack(am.payload, runner.dtype, runner.device).detach())
        if runner.is_last:
            loss = lm_loss(out, tokens[:, 1:]) / runner.spec.n_microbatches * scale
            grads = torch.autograd.grad(loss, runner.params, allow_unused=True)
        else:
            gm = decode_message(grad, limits)
            if not isinstance(gm, GradientMessage):
                raise WireError("an input is not a gradient message.")
            grads = _backward(runner, packer, out, gm)
        _accumulate(total, grads)
    return runner.layout.pack(total, runner.current_U()).cpu()


def _backward(runner: StageRunner, packer: WirePacker, out: torch.Tensor, gm: GradientMessage) -> tuple:
    """d(out . g)/dtheta for the gradient message `gm`, as the replica computed it (a sender's overflow
    stands in as zeros)."""
    g = packer.unpack(gm.payload, runner.dtype, runner.device)
    if gm.overflow and runner.loss_scale is not None:
        g = torch.zeros_like(g)
    return torch.autograd.grad(out, runner.params, grad_outputs=g.to(out.dtype), allow_unused=True)


def _accumulate(total: list[torch.Tensor], grads: tuple) -> None:
    for t, g in zip(total, grads):
        if g is not None:
            t.add_(g)


def recompute_head_share(daemon: StageDaemon, tokens: list[torch.Tensor],
                         bodies: list[tuple[bytes, bytes | None]]) -> torch.Tensor | str:
    """Worker thread: a head's share (stage 0) from the `tokens` regenerated here, checked against
    the activations it sent (`bodies`' first halves), or why it is not its work: per microbatch m

        out_m = stage0(tokens_m);  the sent activation must hold tokens_m and unpack to
        roundtrip(out_m) within the tolerance;  share = sum_m d(out_m . g_m)/dtheta, packed."""
    runner, packer, limits = daemon.runner, daemon.packer, daemon._limits()
    tol = TOLERANCE[COMPUTE_DTYPES[daemon.spec.dtype]]
    total = [torch.zeros_like(p) for p in runner.params]
    for t, (act, grad) in zip(tokens, bodies):
        am, gm = decode_message(act, limits), decode_message(grad, limits)
        if not isinstance(am, ActivationMessage) or not isinstance(gm, GradientMessage):
            raise WireError("the inputs are not an activation and a gradient message.")
        if am.header.microbatch != gm.header.microbatch or not torch.equal(am.tokens.cpu(), t.cpu()):
            return f"the activation of microbatch {am.header.microbatch} it sent does not carry its tokens"
        out = runner.output(t.to(runner.device), None)
        off = disagreement(packer.roundtrip(out.detach()), packer.unpack(am.payload, runner.dtype, runner.device))
        if not off <= tol:
            return f"the activation of microbatch {am.header.microbatch} it sent differs from its forward by {off:.3g}"
        _accumulate(total, _backward(runner, packer, out, gm))
    return runner.layout.pack(total, runner.current_U()).cpu()


def recompute_tokens_share(daemon: StageDaemon, tokens: list[torch.Tensor]) -> torch.Tensor:
    """Worker thread: a head's share in a one-stage swarm (pure data parallel), whose only input is
    the `tokens`, regenerated here:

        share = sum_m d(lm_loss(model(tokens_m)) / n_microbatches x loss scale)/dtheta, packed."""
    runner = daemon.runner
    scale = runner.loss_scale.scale if runner.loss_scale is not None else 1.0
    total = [torch.zeros_like(p) for p in runner.params]
    for t in tokens:
        t = t.to(runner.device)
        loss = lm_loss(runner.output(t, None), t[:, 1:]) / runner.spec.n_microbatches * scale
        _accumulate(total, torch.autograd.grad(loss, runner.params, allow_unused=True))
    return runner.layout.pack(total, runner.current_U()).cpu()


def disagreement(recomputed: torch.Tensor, sent: torch.Tensor) -> float:
    """||recomputed - sent|| / ||recomputed||, in float64."""
    a, b = recomputed.double(), sent.double().to(recomputed.device)
    return float((a - b).norm() / a.norm().clamp_min(1e-300))


class ShareCheck:
    def __init__(self, daemon: StageDaemon, wait: TransferWait | None = None) -> None:
        self.daemon = daemon
        # the inputs' deadline grows with their bytes (peer/daemon/transfer_time.py)
        self.wait = wait or TransferWait(60.0, daemon.spec.slowest_uplink_bps)
        self.spec = daemon.spec
        # the spec's compute dtype: a bf16 or fp16 run keeps fp32 weights (runner.dtype) but computes in bf16/fp16
        self.tolerance = TOLERANCE[COMPUTE_DTYPES[self.spec.dtype]]
        # a head's: (step, microbatch) -> its tokens, regenerated (peer/data/batches.py): its share is checked from them
        self.tokens: Callable[[int, int], torch.Tensor] | None = None
        self.checks_run = 0  # shares of other replicas recomputed here
        self.input_bytes = 0  # the input messages fetched for them

    def serve(self, req: InputsRequest) -> bytes:
        """The boundary messages of this replica's microbatches, for a checker of its stage."""
        d = self.daemon
        if (req.step, req.attempt) != (d.runner.step, d.attempt):
            return encode_inputs_reply([])  # not this attempt's: the checker finds none, and says so
        bodies = d.boundary.inputs(req.step, req.attempt, req.microbatches, not d.runner.is_last, d.runner.is_first)
        return encode_inputs_reply(bodies or [])

    async def check(self, cmd: Command, held: dict[str, Contribution]) -> tuple[str, str, list[str]]:
        """(outcome, reason, blame) of the leader's check order `cmd.check` against the contribution
        its target sent in this replica's reduce of the attempt (`held`: sender -> contribution)."""
        try:
            order: CheckOrder = decode_order(cmd.check, self.spec.n_microbatches)
        except WireError as e:
            return "failed", f"the check order is unreadable: {e}", []
        who, sent = order.target[-8:], held.get(order.target)
        if sent is None or sent.grads is None or sent.microbatches != order.microbatches:
            return "failed", f"no contribution of {who} for microbatches {order.microbatches} is held here.", []
        head = self.daemon.runner.is_first  # a head's share: its input, the tokens, regenerated here
        if head and self.tokens is None:
            return "failed", "this peer cannot regenerate a head's tokens.", []
        tokens = [self.tokens(cmd.step, mb) for mb in order.microbatches] if head else []
        if head and self.daemon.runner.is_last:  # one stage: no boundary message to fetch
            return self._verdict(await self.daemon.run(recompute_tokens_share, self.daemon, tokens), sent, who, cmd,
                                 order)
        req = InputsRequest(self.spec.run_hash, cmd.step, cmd.attempt, self.daemon.stage, order.microbatches)
        try:
            inputs = 2 * len(order.microbatches) * boundary_bytes(self.spec)  # each one's activation and gradient
            reply = await self.daemon.link.request(order.target, KIND_REDUCE, encode_inputs_request(req),
                                                   timeout=self.wait.seconds(inputs))
        except Exception as e:  # unreachable now: no verdict (a link's hiccup is no lie); the leader asks again
            return "failed", f"replica {who} could not be asked for the inputs of its share ({e}).", []
        self.input_bytes += len(reply)
        try:
            bodies = decode_inputs_reply(reply, len(order.microbatches), self.daemon._limits().max_bytes)
        except WireError as e:
            return "failed", f"replica {who} did not give the inputs of its share ({self._refusal(reply) or e}).", \
                [order.target]
        for mb, (act, grad), (want_a, want_g) in zip(order.microbatches, bodies, order.inputs):
            if digest(act) != want_a or (want_g is not None and (grad is None or digest(grad) != want_g)):
                return "failed", f"replica {who} gave inputs of microbatch {mb} that its senders did not send.", \
                    [order.target]
        try:
            if head:
                share = await self.daemon.run(recompute_head_share, self.daemon, tokens, bodies)
            else:
                share = await self.daemon.run(recompute_share, self.daemon, bodies)
        except (WireError, RuntimeError, ValueError) as e:
            return "failed", f"replica {who}'s inputs could not be recomputed ({e}).", [order.target]
        if isinstance(share, str):
            log.warning("stage 0: head %s's work in step %d is not its state's: %s", who, cmd.step + 1, share)
            return "failed", f"head {who}: {share}.", [order.target]
        return self._verdict(share, sent, who, cmd, order)

    def _verdict(self, share: torch.Tensor, sent: Contribution, who: str, cmd: Command,
                 order: CheckOrder) -> tuple[str, str, list[str]]:
        self.checks_run += 1
        off = disagreement(share, sent.grads)
        if off <= self.tolerance:
            return "ok", "", []
        log.warning("stage %d: replica %s's contribution to step %d is not its work: recomputed here, it differs "
                    "by %.3g of its norm (tolerance %.0e)", self.daemon.stage, who, cmd.step + 1, off, self.tolerance)
        return "failed", f"replica {who}'s contribution differs from its recomputed share by {off:.3g} of its norm.", \
            [order.target]

    def _refusal(self, reply: bytes) -> str | None:
        try:
            err = decode_message(reply, self.daemon._limits())
        except WireError:
            return None
        return err.reason if isinstance(err, ErrorReply) else None
