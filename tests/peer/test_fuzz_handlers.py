"""Hypothesis fuzz over every handler of every stage (head, middle, tail), the coordinator's
statistics handler and the basis handler: random bytes, and valid messages with fields and
tensors replaced by anything. No input may raise out of a handler, and no input may change a
peer's weights, optimizer state, step or basis version (compared before and after).

The handlers run over the in-memory loopback (no membership check in front of them, so every
input reaches the decoders). CI runs a slice (SWARM_FUZZ_EXAMPLES, default 150 per target);
the long run sets SWARM_FUZZ_EXAMPLES=10000 or more.
"""
from __future__ import annotations

import asyncio
import hashlib
import os

import msgpack
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peer.runner.stage import StageRunner
from protocol.basis_update import StatsMessage, encode_stats
from protocol.control import Command, Contribution, ReduceProbe, encode_command, encode_contribution, encode_probe
from protocol.spec import preset
from protocol.wire import (
    KIND_ACTIVATION,
    KIND_BASIS,
    KIND_CONTROL,
    KIND_FOLLOW,
    KIND_GRADIENT,
    KIND_REDUCE,
    KIND_STATE,
    pack_tensor,
)
from swarm.basis.refit import BasisRefitter
from swarm.trust.keys import SigningKey
from tests.peer.swarm_in_memory import make_swarm
from tests.swarm.test_refit_trust import FakeDHT, FakeTransport

EXAMPLES = int(os.environ.get("SWARM_FUZZ_EXAMPLES", "150"))
SPEC = preset("tiny", stages=3, codec="subspace", basis_interval=5)
KINDS = (KIND_ACTIVATION, KIND_GRADIENT, KIND_CONTROL, KIND_REDUCE, KIND_FOLLOW, KIND_STATE, KIND_BASIS)


def state_hash(runner: StageRunner) -> str:
    """Weights, optimizer state, step and basis version, as one hash."""
    h = hashlib.sha256()
    for t in list(runner.module.state_dict().values()):
        h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for st_ in runner.optimizer.state.values():
        for v in st_.values():
            h.update(v.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                     if isinstance(v, torch.Tensor) else repr(v).encode())
    h.update(repr((runner.step, runner.basis_version, runner.scheduled)).encode())
    return h.hexdigest()


# ---------------------------------------------------------------- inputs
msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True) | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner, max_size=4),
    max_leaves=8)

dtypes = st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.uint8, torch.int32,
                          torch.int64, torch.float16])


@st.composite
def tensors(draw) -> msgpack.ExtType:
    shape = draw(st.lists(st.integers(0, 9), min_size=0, max_size=4))
    dtype = draw(dtypes)
    fill = draw(st.sampled_from([0.0, 1.0, 3e38, float("nan"), float("inf"), -1.0]))
    return pack_tensor(torch.full(shape, fill).to(dtype) if dtype.is_floating_point else
                       torch.full(shape, int(fill) if abs(fill) < 100 else 7).to(dtype))


def valid_bodies(step: int) -> dict[str, dict]:
    """Valid messages (as maps) of each kind, for the mutations to start from."""
    B, T, w = SPEC.microbatch_size, SPEC.seq_len, SPEC.rank
    header = {"r": SPEC.run_hash, "s": step, "a": 0, "m": 0, "v": 0, "c": SPEC.codec, "g": 1}
    act = {"k": KIND_ACTIVATION, **header, "t": pack_tensor(torch.zeros(B, T + 1, dtype=torch.uint8)),
           "p": pack_tensor(torch.randn(B, T, w))}
    grad = {"k": KIND_GRADIENT, **header, "l": 1.0, "p": pack_tensor(torch.randn(B, T, w))}
    ctl = msgpack.unpackb(encode_command(Command(SPEC.run_hash, step, 0, "reduce", [])), raw=False,
                          strict_map_key=False)
    red = msgpack.unpackb(encode_contribution(Contribution(SPEC.run_hash, step, 0, 1, [0], torch.zeros(5))),
                          raw=False, strict_map_key=False, ext_hook=lambda c, d: msgpack.ExtType(c, d))
    stats = msgpack.unpackb(encode_stats(StatsMessage(SPEC.run_hash, 1, 0, 5, torch.zeros(SPEC.d_model, SPEC.rank))),
                            raw=False, ext_hook=lambda c, d: msgpack.ExtType(c, d))
    return {KIND_ACTIVATION: act, KIND_GRADIENT: grad, KIND_CONTROL: ctl, KIND_REDUCE: red, KIND_FOLLOW: red,
            KIND_STATE: {"k": "state", "r": SPEC.run_hash, "o": "meta", "i": 0, "n": 0}, KIND_BASIS: stats,
            "stats": stats}


@st.composite
def bodies(draw, kind: str, step: int) -> bytes:
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return draw(st.binary(max_size=300))
    base = dict(valid_bodies(step)[kind])
    if kind == KIND_REDUCE and draw(st.booleans()):  # a probe of how the replica's reduce goes, not a contribution
        base = msgpack.unpackb(encode_probe(ReduceProbe(SPEC.run_hash, step, 0, 1)), raw=False)
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(base) + ["zz"]))
        if draw(st.booleans()):
            base[key] = draw(tensors()) if draw(st.booleans()) else draw(msgpack_values)
        else:
            base.pop(key, None)
    if choice == 3:  # a header field nudged around the step in progress
        base["s"] = step + draw(st.integers(-2, 2))
        base["a"] = draw(st.integers(0, 3))
    try:
        return msgpack.packb(base)
    except (OverflowError, TypeError, ValueError):
        return draw(st.binary(max_size=50))


# ---------------------------------------------------------------- the fuzz
def test_no_input_changes_any_peer_state_or_escapes_a_handler():
    loop = asyncio.new_event_loop()  # the peers live on this loop; hypothesis drives it one input at a time
    try:
        _fuzz(loop)
    finally:
        loop.close()


async def _ended(tasks: list[asyncio.Task]) -> None:
    await asyncio.gather(*tasks, return_exceptions=True)


def _fuzz(loop: asyncio.AbstractEventLoop) -> None:
    swarm = loop.run_until_complete(make_swarm(SPEC, [1, 1, 1]))
    refitter = None
    try:
        loop.run_until_complete(swarm.drive(2))
        peers = dict(swarm.peers)
        for p in peers.values():  # an input for the next step waits this long for it: seconds of nothing here
            p.daemon.future_step_wait = 0.02
        before = {name: state_hash(p.runner) for name, p in peers.items()}
        step = peers["s0r0"].runner.step
        targets = [(name, kind) for name in peers for kind in KINDS if (name, kind) in swarm.net.handlers]
        refitter = BasisRefitter(SPEC, SigningKey.generate(), FakeDHT({1: ["s1r0"], 2: ["s2r0"]}), FakeTransport(),
                                 ttl=60)
        targets.append(("coordinator", "stats"))
        senders = st.sampled_from(list(peers) + ["12D3KooWstranger"])
        count = 0
        def fuzzer(handler, kind: str):
            @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(body=bodies(kind, step), sender=senders)
            def fuzz(body: bytes, sender: str) -> None:
                nonlocal count
                reply = loop.run_until_complete(asyncio.wait_for(handler(body, sender), timeout=30))
                assert isinstance(reply, bytes)
                count += 1
            return fuzz

        for name, kind in targets:
            fuzzer(refitter.on_stats if name == "coordinator" else swarm.net.handlers[(name, kind)], kind)()
        for p in peers.values():  # let whatever the inputs started finish before looking
            loop.run_until_complete(p.daemon.drain(5.0))
            loop.run_until_complete(p.daemon.run(lambda: None))
        after = {name: state_hash(p.runner) for name, p in peers.items()}
        assert after == before, "an input changed a peer's weights, optimizer state, step or basis"
        assert refitter.published == []
        assert count >= EXAMPLES * len(targets) // 2
        print(f"fuzzed {count} inputs over {len(targets)} handlers")
    finally:
        if refitter is not None:  # its re-checks of the statistics the fuzzer sent end with the test
            rechecks = list(refitter._rechecks.values())
            refitter.stop()
            loop.run_until_complete(_ended(rechecks))
        loop.run_until_complete(swarm.stop())
