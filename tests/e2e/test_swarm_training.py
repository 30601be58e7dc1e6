"""The central test of the product: a real swarm of OS processes over libp2p trains exactly
like the in-process oracle, and the bytes its transport counts are the protocol's formula.

coordinator + 3 peers (3 stages) on 127.0.0.1, `tiny` preset, fp32, 20 steps, per codec.
"""
from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from protocol.codecs import WireTensors
from protocol.spec import WIRE_DTYPES, preset
from protocol.wire import ActivationMessage, GradientMessage, Header, token_bytes
from swarm.local import LocalOptions, run_local
from swarm.net.transport import framing_bytes
from tests.protocol.test_wire import expected_header

STEPS = 20
SIGNED_FRAME = 3 + 2 + 36 + 64  # a boundary message's signature frame, Ed25519 identity (framed_bytes_per_token)


def framed_bytes_per_token(spec, kind: str, step: int = 1, mb: int = 1, attempt: int = 0,
                           direct: bool = False) -> float:
    """The formula, independent of the encoder: B*T*w*e (+ B*(T+1)*tb token ids) + H per message,
    H the msgpack sizes of every header field, read off the documented layout
    (tests/protocol/test_wire.py `expected_header`), + S, the sender's signature in front of the message
    (protocol/boundary_sig.py: 0xc1, a u16 length, then swarm/trust/boundary_signer.py's u16 key length, the
    36-byte protobuf of an Ed25519 public key and its 64-byte signature: S = 3 + 2 + 36 + 64 = 105),
    + 4 bytes of request framing + the 5-byte
    "accepted" reply frame over libp2p, or with `direct` the direct channel's header and two 32-byte tags
    (docs/wire.md). Every header integer is below 128 here, so H is the same for all."""
    B, T, w = spec.microbatch_size, spec.seq_len, spec.boundary_width
    e = {"fp32": 4, "bf16": 2, "fp64": 8}[spec.wire_dtype]
    fake = torch.empty(B, T, w, dtype=WIRE_DTYPES[spec.wire_dtype])  # only its shape and dtype are read
    h = Header(spec.run_hash, step, mb, 0, spec.codec, 1, attempt)
    if kind == "act":
        msg = ActivationMessage(h, torch.empty(B, T + 1, dtype=torch.uint8), WireTensors(fake))
        data = B * T * w * e + B * (T + 1) * token_bytes(spec.vocab)
    else:
        msg = GradientMessage(h, WireTensors(fake), 1.5)
        data = B * T * w * e
    body = data + expected_header(msg, spec.vocab) + SIGNED_FRAME
    return (body + framing_bytes(kind, body, 0 if direct else None)) / (B * T)


def oracle_once_training(oracle_runs, spec, head_report: Path, stop: threading.Event) -> list[float]:
    """The oracle's losses, trained once the swarm trains: its start-up takes both cores, its steps
    (one thread per peer, each waiting on the next stage) leave one mostly idle."""
    while not stop.is_set() and not (head_report.exists() and '"event": "step"' in head_report.read_text()):
        stop.wait(0.2)  # poll interval of the head's report
    return oracle_runs.losses(spec, STEPS)  # one torch thread, as in the peers (tests/oracle_runs.py)


@pytest.mark.parametrize("codec", ["subspace", "bottleneck", "dense"])
def test_swarm_matches_oracle_and_counts_bytes(codec, tmp_path, oracle_runs):
    spec = preset("tiny", codec=codec, stages=3)
    metrics_file = tmp_path / "metrics.json"
    ran = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        oracle = pool.submit(oracle_once_training, oracle_runs, spec, tmp_path / "run" / "stage0.jsonl", ran)
        try:
            result = run_local(LocalOptions(spec, steps=STEPS, workdir=str(tmp_path / "run"),
                                            metrics_out=str(metrics_file), quiet=True, threads=1))
        finally:
            ran.set()
        oracle = oracle.result()

    # the metrics file is what the user gets
    written = json.loads(metrics_file.read_text())
    assert [s["step"] for s in written["steps"]] == list(range(1, STEPS + 1))
    assert written["run"]["codec"] == codec

    swarm = [s["loss"] for s in result["steps"]]
    for step, (a, b) in enumerate(zip(swarm, oracle), start=1):
        assert abs(a - b) / abs(b) < 1e-5, f"step {step}: swarm loss {a} vs oracle {b}"
    assert swarm[-1] < swarm[0] - 0.5, "the swarm did not learn"

    wire = result["wire"]
    n_boundaries = spec.n_stages - 1
    tokens_per_step = spec.batch_size * spec.seq_len
    assert wire["forward_tokens"] == wire["backward_tokens"] == STEPS * tokens_per_step * n_boundaries
    for kind, direction in (("act", "forward"), ("grad", "backward")):
        # every message is exactly its framed size; a message sent again (a receiver that had not read
        # the sender's announcement yet asks it to retry, docs/security.md) costs one more message and
        # a refusal of under 1 KiB. Counted, never waved through: at most 2 re-sends in the run. A message
        # of 64 KiB or more (dense) goes over the direct channel once the sender has found its receiver
        # out (the first ones over libp2p): the peers report how many did, each framed as the channel frames
        direct = wire[f"{direction}_direct_messages"]
        per_message = framed_bytes_per_token(spec, kind) * spec.microbatch_size * spec.seq_len
        per_direct = framed_bytes_per_token(spec, kind, direct=True) * spec.microbatch_size * spec.seq_len
        if codec == "dense":
            assert direct >= 1, "no dense frame went over the direct channel"
        else:
            assert direct == 0, "a compressed frame (under 64 KiB here) went over the direct channel"
        extra = (wire[f"{direction}_bytes"] - framed_bytes_per_token(spec, kind) * wire[f"{direction}_tokens"]
                 - direct * (per_direct - per_message))
        resent = round(extra / per_message)
        assert 0 <= resent <= 2, (direction, extra)
        if resent == 0:
            assert extra == pytest.approx(0, abs=1e-6), (direction, extra)
        else:
            assert 0 <= extra - resent * per_message < 1024 * resent, (direction, extra)
    per_number = 4  # fp32 wire
    assert wire["forward_bytes_per_token"] >= spec.boundary_width * per_number
    if codec != "dense":
        ratio = wire["dense_forward_bytes_per_token"] / wire["forward_bytes_per_token"]
        assert ratio > 0.9 * spec.d_model / spec.rank
