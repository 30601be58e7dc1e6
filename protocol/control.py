"""Messages that keep the replicas of a stage in step, validated on the way in like wire.py.

A step ends with a commit that the step driver (the leading head) runs once every
microbatch's gradient is back (docs/design.md section 3):

    reduce  each stage's replicas exchange their gradient sums (`Contribution`) and add them
            up in one agreed order, so that every replica holds the same summed gradient;
    apply   every replica that reduced takes the optimizer step with it;
    abort   a failed attempt's partial work is dropped everywhere, and the step is re-driven;
    rollback  every replica goes back to the stage's snapshot at step s (peer/state/rollback.py);
    work    a head computes the microbatches m of the attempt; at stage 1: c names the heads that may feed it.

Maps (short keys; tensors are wire.py's ExtType):

    Command       {k: "ctl", r: run, s: step, a: attempt, o: op, c: [peer ids], d: step record, v: skip,
                   q: check order, b: [banned peer ids], w: why, m: [microbatches], p: [disputed stages]}
                  op in status | reduce | apply | abort | rollback | lease | check | work; c: for reduce, the candidate
                  replicas of the receiver's stage (it exchanges contributions with those); d: for
                  reduce, the leader's signed `StepRecord` of the attempt (protocol/step_record.py;
                  absent in swarms without a coordinator); lease: the coordinator asks the peer to
                  read the leader lease again now (it says nothing itself: the lease is read signed);
                  v (fp16; left out when false): apply means skip, some stage overflowed
                  (protocol/loss_scale.py); q: for check, a `CheckOrder` (protocol/spot_check.py);
                  b: for abort, replicas the leader convicted (false, withheld or too slow work), banned for the run;
                  w (left out when empty): for an abort sent to a banned replica, the leader's reason, one
                  sentence that its owner is shown (a slow uplink is told so, not called a liar); p (left out
                  when empty): for abort, the stages whose two replicas disagree at this step, which wait
                  for a third (peer/checks/spot_checks.py; placement draws one, swarm/replicas/placement.py);
                  work (peer/commit/head_work.py): c the heads the leader named for the attempt, m (to a head) its share
    CommandReply  {k: "ctlr", s: step, a: attempt, o: outcome, m: [microbatches], x: {peer: [mb]}, e: text,
                   h: [step, sha256 hex], v, z: [step, sha256 hex], n: [sent], b: [peer ids], u: [peer ids],
                   l: [losses], f: signature}
                  outcome in ok | behind | ahead | failed; m: what this replica computed in the
                  attempt; x: after a reduce, whose contributions it summed; h: after a reduce, the
                  step and hash of the replica's newest own snapshot (peer/state/snapshots.py), which the
                  leader vouches for through the coordinator once the stage's replicas agree; v (fp16;
                  left out when false): after a reduce, the stage overflowed; "ahead", this replica
                  skipped the step; z (left out when absent): after an apply, the steps applied and the
                  sha256 of the replica's state then (peer/runner/state_hash.py), which the leader votes on
                  and vouches for through the coordinator (peer/checks/state_votes.py); after a reduce, n: the
                  boundary messages it sent in the attempt (protocol/spot_check.py `Sent`), b: replicas
                  whose contribution it refused or that withheld it, u: shares far from the rest
                  (peer/checks/robust_sum.py); after a check, b: the replica checked, if its share is not its work;
                  after a work, l: the loss of each microbatch of m, in m's order (finite floats); f (left out when
                  empty): a reduce refused for its step record, the refuser's signature of the refusal
                  (protocol/refusal.py), which the leader may show the coordinator
    Contribution  {k: "red", r, s, a, g: stage, p: phase, m: [microbatches], t: flat gradient | nil,
                   f: factors | nil, q: statistic | nil}
                  replica_sync "exact" (one phase, p = 0): t is every trainable parameter's
                  gradient in the stage's `SyncLayout` (flattened and concatenated in the
                  module's parameter order, constrained weights in subspace coordinates), in
                  the compute dtype (nil when m is empty: nothing to add); f is nil.
                  "powersgd" (two phases, docs/algorithms.md 5.2): p = 0 carries t = the
                  exactly-summed part (vectors, small matrices) and f = the P factors, both
                  nil when m is empty (no microbatch, no factors: a replica's error feedback
                  waits for a step it works in); p = 1 carries only f = the Q factors (nil: zero), m = [].
                  Factors are in the run's wire dtype. q: the basis re-fit statistic of the
                  step (receiving subspace stages; with p = 0 and a non-empty m only); v (fp16): overflowed, t f q nil
    ReduceProbe   {k: "redq", r, s, a, g}, also over `red`: asked of a replica whose contribution
                  a reduce still waits for (peer/commit/reduce_watch.py); the reply {k: "redqr", o: state}
                  says how its reduce of step s, attempt a goes: reducing | idle (at the step and
                  attempt, no reduce begun) | ended (its reduce is over) | elsewhere (another step
                  or a newer attempt)
State transfer (a joining replica's download) and the follow updates that bring it level are in
`protocol/state_wire.py`; what a stage accepts as a flat gradient (`FlatLimits`) in `protocol/flat_limits.py`,
and the field checks every decoder shares in `protocol/fields.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import msgpack
import torch

from protocol.boundary_sig import MAX_SIGNATURE
from protocol.fields import (
    MAX_GROUP,
    check_run,
    flag_field,
    int_field,
    microbatch_list,
    opt_tensor,
    peer_list,
    same,
    unpack_map,
    with_flag,
)
from protocol.flat_limits import FlatLimits, flat_tensor, stat_tensor
from protocol.spot_check import DIGEST_BYTES, decode_sent, encode_sent, inputs_request, is_inputs_request
from protocol.wire import KIND_CONTROL, KIND_REDUCE, WireError, need

OPS = ("status", "reduce", "apply", "abort", "rollback", "lease", "check", "work")
OUTCOMES = ("ok", "behind", "ahead", "failed")
PROBE_STATES = ("reducing", "idle", "ended", "elsewhere")
MAX_MICROBATCHES = 4096  # indices a work command may carry (the receiver checks them against its spec)
_REPLY = "ctlr"
_PROBE, _PROBE_REPLY = "redq", "redqr"


@dataclass
class Command:
    run: str
    step: int
    attempt: int
    op: str
    candidates: list[str] = field(default_factory=list)
    record: bytes = b""  # reduce: the leader's encoded StepRecord of this attempt
    skip: bool = False  # apply: skip the step (fp16 overflow on some stage)
    check: bytes = b""  # check: the encoded `CheckOrder` (protocol/spot_check.py)
    banned: list[str] = field(default_factory=list)  # abort: replicas the leader caught; banned for the run
    microbatches: list[int] = field(default_factory=list)  # work: the head's share of the attempt
    why: str = ""  # abort, to a banned replica: the leader's reason
    disputed: list[int] = field(default_factory=list)  # abort: stages whose two replicas disagree (wait for a third)


@dataclass
class CommandReply:
    step: int
    attempt: int
    outcome: str
    microbatches: list[int] = field(default_factory=list)
    contributors: dict[str, list[int]] = field(default_factory=dict)
    reason: str = ""
    snapshot: tuple[int, str] | None = None  # (step, sha256 hex) of the replica's newest own snapshot
    overflow: bool = False  # reduce: this stage's share overflowed; "ahead": this replica skipped the step
    sent: list = field(default_factory=list)  # reduce: the boundary messages it sent (protocol/spot_check.Sent)
    blame: list[str] = field(default_factory=list)  # reduce, check: replicas whose contribution it found false
    suspects: list[str] = field(default_factory=list)  # reduce: shares far from the rest (peer/checks/robust_sum.py)
    state: tuple[int, str] | None = None  # apply: (steps applied, sha256 hex) of the replica's state after it
    losses: list[float] = field(default_factory=list)  # work: each microbatch's loss, in the command's order
    refusal: bytes = b""  # reduce refused for its step record: the refuser's signature (protocol/refusal.py)


@dataclass
class Contribution:
    run: str
    step: int
    attempt: int
    stage: int
    microbatches: list[int]
    grads: torch.Tensor | None  # flat, compute dtype; None when there is nothing to add
    stat: torch.Tensor | None = None
    phase: int = 0  # the exchange round (replica_sync "powersgd" has two)
    factors: torch.Tensor | None = None  # flat PowerSGD factors, wire dtype ("powersgd" only)
    overflow: bool = False  # fp16: this replica's share overflowed (no tensors then)


@dataclass
class ReduceProbe:
    run: str
    step: int
    attempt: int
    stage: int


# ---------------------------------------------------------------- commands

def encode_command(c: Command) -> bytes:
    body = with_flag({"k": KIND_CONTROL, "r": c.run, "s": c.step, "a": c.attempt, "o": c.op, "c": c.candidates},
                     "v", c.skip)
    body.update({k: v for k, v in (("d", c.record), ("q", c.check), ("b", c.banned), ("m", c.microbatches),
                                   ("w", c.why[:500]), ("p", c.disputed)) if v})  # left out when empty
    return msgpack.packb(body)


def decode_command(data: bytes, run: str) -> Command:
    d = unpack_map(data, 96 << 10, "a control command", max_bin=64 << 10)  # bytes: the step record, a check order
    need(same(d.get("k"), KIND_CONTROL), "not a control command.")
    check_run(d, run, "the control command")
    need(d.get("o") in OPS, f"a control command's op must be one of {', '.join(OPS)}.")
    record = d.get("d", b"")
    need(isinstance(record, bytes) and len(record) <= 4096, "a control command's step record must be a few bytes.")
    check = d.get("q", b"")
    need(isinstance(check, bytes), "a control command's check order must be bytes.")
    why = d.get("w", "")
    need(isinstance(why, str) and len(why) <= 500, "a control command's reason must be a short text.")
    disputed = d.get("p", [])
    need(isinstance(disputed, list) and len(disputed) <= 64 and all(
        isinstance(s, int) and not isinstance(s, bool) and 0 <= s < 2**16 for s in disputed),
        "a control command's disputed stages must be a short list of stage numbers.")
    return Command(run, int_field(d, "s", "step"), int_field(d, "a", "attempt", 2**31), d["o"],
                   peer_list(d.get("c", [])), record, flag_field(d, "v", "a control command's skip flag"), check,
                   peer_list(d.get("b", [])), microbatch_list(d.get("m", []), MAX_MICROBATCHES), why, disputed)


def encode_reply(r: CommandReply) -> bytes:
    body = with_flag({"k": _REPLY, "s": r.step, "a": r.attempt, "o": r.outcome, "m": r.microbatches,
                      "x": r.contributors, "e": r.reason[:500]}, "v", r.overflow)
    body.update({k: v for k, v in (("h", list(r.snapshot or ())), ("z", list(r.state or ())),
                                   ("n", encode_sent(r.sent)), ("b", r.blame), ("u", r.suspects),
                                   ("l", r.losses), ("f", r.refusal)) if v})  # if any
    return msgpack.packb(body)


def decode_reply(data: bytes, n_microbatches: int) -> CommandReply:
    # bytes: digests of what it sent, and its senders' signatures of what it received (protocol/boundary_sig.py)
    d = unpack_map(data, 64 << 10, "a control reply", max_bin=max(DIGEST_BYTES, MAX_SIGNATURE))
    need(same(d.get("k"), _REPLY), "not a control reply.")
    need(d.get("o") in OUTCOMES, f"a control reply's outcome must be one of {', '.join(OUTCOMES)}.")
    x = d.get("x", {})
    need(isinstance(x, dict) and len(x) <= MAX_GROUP, "a control reply's contributors must be a small map.")
    contributors = {str(p)[:128]: microbatch_list(m, n_microbatches) for p, m in x.items() if isinstance(p, str)}
    need(len(contributors) == len(x), "a control reply's contributors must be keyed by peer id.")
    reason = d.get("e", "")
    h = d.get("h")
    need(h is None or isinstance(h, list) and len(h) == 2 and isinstance(h[0], int) and 0 < h[0] < 2**53
         and isinstance(h[1], str) and len(h[1]) == 64, "a control reply's snapshot must be [step, sha256 hex].")
    z = d.get("z")
    need(z is None or isinstance(z, list) and len(z) == 2 and isinstance(z[0], int) and not isinstance(z[0], bool)
         and 0 < z[0] < 2**53 and isinstance(z[1], str) and len(z[1]) == 64,
         "a control reply's state hash must be [step, sha256 hex].")
    losses = d.get("l", [])
    need(isinstance(losses, list) and len(losses) <= n_microbatches and all(
        isinstance(v, float) and math.isfinite(v) for v in losses), "a control reply's losses must be finite floats.")
    refusal = d.get("f", b"")
    need(isinstance(refusal, bytes) and len(refusal) <= MAX_SIGNATURE, "a control reply's refusal must be a signature.")
    return CommandReply(int_field(d, "s", "step"), int_field(d, "a", "attempt", 2**31), d["o"],
                        microbatch_list(d.get("m", []), n_microbatches), contributors,
                        reason if isinstance(reason, str) else "", (h[0], h[1]) if h else None,
                        flag_field(d, "v", "a control reply's overflow flag"),
                        decode_sent(d.get("n", []), n_microbatches), peer_list(d.get("b", [])),
                        peer_list(d.get("u", [])), (z[0], z[1]) if z else None, list(losses), refusal)


# ---------------------------------------------------------------- contributions and follow updates

def encode_contribution(c: Contribution) -> bytes:
    return msgpack.packb(with_flag({"k": KIND_REDUCE, "r": c.run, "s": c.step, "a": c.attempt, "g": c.stage,
                                    "p": c.phase, "m": c.microbatches, "t": opt_tensor(c.grads),
                                    "f": opt_tensor(c.factors), "q": opt_tensor(c.stat)}, "v", c.overflow))


def encode_probe(p: ReduceProbe) -> bytes:
    return msgpack.packb({"k": _PROBE, "r": p.run, "s": p.step, "a": p.attempt, "g": p.stage})


def encode_probe_reply(state: str) -> bytes:
    return msgpack.packb({"k": _PROBE_REPLY, "o": state})


def decode_probe_reply(data: bytes) -> str:
    d = unpack_map(data, 256, "a probe reply")
    need(same(d.get("k"), _PROBE_REPLY) and d.get("o") in PROBE_STATES, "not a probe reply.")
    return d["o"]


class BadContribution(WireError):
    """A contribution for the stage's (step, attempt, phase) refused for its content (NaN, a wrong size)."""

    def __init__(self, reason: str, step: int, attempt: int, phase: int) -> None:
        super().__init__(reason)
        self.step, self.attempt, self.phase = step, attempt, phase


def decode_reduce(data: bytes, lim: FlatLimits):
    """What arrives over `red`: a contribution, a probe of how this replica's reduce goes, or a
    checker's request for the inputs of this replica's share (protocol/spot_check.py). A
    contribution refused for its content raises `BadContribution`."""
    d = unpack_map(data, lim.max_bytes, "a reduce message")
    if is_inputs_request(d):
        return inputs_request(d, lim.run, lim.stage, lim.n_microbatches)
    if not same(d.get("k"), _PROBE):
        try:
            return _contribution(d, lim)
        except WireError as e:
            key = [d.get(k, 0) for k in "sap"]
            if same(d.get("k"), KIND_REDUCE) and same(d.get("r"), lim.run) and same(d.get("g"), lim.stage) and all(
                    isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**31 for v in key):
                raise BadContribution(str(e), *key) from None
            raise
    check_run(d, lim.run, "the reduce probe")
    need(same(d.get("g"), lim.stage), f"the probe is not for stage {lim.stage}, which this replica serves.")
    return ReduceProbe(lim.run, int_field(d, "s", "step"), int_field(d, "a", "attempt", 2**31), lim.stage)


def decode_contribution(data: bytes, lim: FlatLimits) -> Contribution:
    return _contribution(unpack_map(data, lim.max_bytes, "a gradient contribution"), lim)


def _contribution(d: dict, lim: FlatLimits) -> Contribution:
    need(same(d.get("k"), KIND_REDUCE), "not a gradient contribution.")
    check_run(d, lim.run, "the gradient contribution")
    need(same(d.get("g"), lim.stage), f"the contribution is not for stage {lim.stage}, which this replica serves.")
    step, attempt = int_field(d, "s", "step"), int_field(d, "a", "attempt", 2**31)
    lim = lim.at(step)
    phase = d.get("p", 0)
    need(isinstance(phase, int) and not isinstance(phase, bool) and 0 <= phase < len(lim.exchange),
         f"the contribution's phase must be an integer in [0, {len(lim.exchange)}).")
    mbs = microbatch_list(d.get("m"), lim.n_microbatches)
    if flag_field(d, "v", "a contribution's overflow flag"):  # fp16: the step will be skipped; nothing to add
        need(phase == 0 and all(d.get(k) is None for k in "tfq"), "an overflowed contribution carries no tensors.")
        return Contribution(lim.run, step, attempt, lim.stage, mbs, None, overflow=True)
    n_exact, n_factors = lim.exchange[phase]
    if not lim.phases:  # exact sync: the whole gradient, or nothing when nothing was computed
        need(d.get("f") is None, "an exact-sync contribution carries no factors.")
        if not mbs:
            need(d.get("t") is None and d.get("q") is None, "an empty contribution carries no tensors.")
            return Contribution(lim.run, step, attempt, lim.stage, [], None)
        return Contribution(lim.run, step, attempt, lim.stage, mbs,
                            flat_tensor(d.get("t"), lim, "the contributed gradient"), stat_tensor(d.get("q"), lim))
    if phase > 0:
        need(not mbs and d.get("t") is None and d.get("q") is None,
             "a second-round contribution carries only factors.")
        factors = None if d.get("f") is None else flat_tensor(d["f"], lim, "the contributed factors", n_factors,
                                                              lim.factor_dtype)
        return Contribution(lim.run, step, attempt, lim.stage, [], None, None, phase, factors)
    if not mbs:  # no microbatch, no factors (issue 21): error feedback waits for a step the replica works in
        need(all(d.get(k) is None for k in "tfq"), "a contribution without microbatches carries no tensors.")
        return Contribution(lim.run, step, attempt, lim.stage, [], None, None, phase, None)
    factors = flat_tensor(d.get("f"), lim, "the contributed factors", n_factors, lim.factor_dtype)
    grads = flat_tensor(d.get("t"), lim, "the contributed exact part", n_exact)
    stat = stat_tensor(d.get("q"), lim) if mbs else None
    return Contribution(lim.run, step, attempt, lim.stage, mbs, grads, stat, phase, factors)
