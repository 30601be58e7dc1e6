"""Bad input against live peers: a stranger is refused by every handler before anything is
decoded; a peer announced for stage 1 (so allowed to talk to stage 2) gets a clear refusal for
every malformed message; the peers keep serving, and their state is exactly what it was
(weights, optimizer state, step and basis version of the checkpoint they write when stopped,
compared with a freshly built stage)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest
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
    maddrs = await asyncio.to_thread(swarm.start_coordinator, serving=False)
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


# ---------------------------------------------------------------- a user's mistakes, through the `swarm` executable
# (issue 55; the cases that start no daemon run in process in tests/swarm/test_user_errors.py)

SWARM = str(Path(sys.executable).with_name("swarm"))
NOBODY = "/ip4/127.0.0.1/tcp/9/p2p/12D3KooWR1bk34552UHxDiTqQsNZapyuxSreNsAP7iY7Cp7BjDfR"  # right form, nobody there
CASE_MARKER = "SWARM_USER_ERROR_CASE"


def _marked(token: str) -> list[int]:
    """Live processes whose environment carries this case's marker (the command, its DHT process, p2pd, reaper)."""
    needle = f"{CASE_MARKER}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except (OSError, IndexError):
            continue
    return found


def run_swarm(*args: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """`swarm ARGS` as a user runs it; after it exits, nothing it started may be left (polled with a deadline)."""
    token = uuid.uuid4().hex
    env = dict(os.environ, **{CASE_MARKER: token, "SWARM_STATE_DIR": str(tmp_path / "state")})
    done = subprocess.run([SWARM, *args], capture_output=True, text=True, timeout=timeout, env=env)
    deadline = time.monotonic() + 15
    while (left := _marked(token)) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll: the reaper and a DHT child end a moment after the command
    assert not left, f"swarm {' '.join(args)} left processes {left} behind"
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _last_error(done: subprocess.CompletedProcess) -> str:
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), done.stderr
    return line


@pytest.mark.parametrize("argv", [["status", "--initial-peers", NOBODY], ["peer", "--initial-peers", NOBODY],
                                  ["export", "--initial-peers", NOBODY, "--out", "OUT"]],
                         ids=["status", "peer", "export"])
def test_nobody_answers_at_the_address(argv, tmp_path):
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    done = run_swarm(*argv, tmp_path=tmp_path)
    assert done.returncode == 1, done.stderr
    assert "no peer answered at --initial-peers; check the address" in _last_error(done)


def test_a_coordinator_on_a_port_in_use_names_the_port_and_its_dtype(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_swarm("coordinator", "--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}", tmp_path=tmp_path)
    assert done.returncode == 1, done.stderr
    assert f"error: port {port} is taken; pass another with --host-maddrs" in _last_error(done)
    assert "swarm coordinator: tiny, 3 stages, codec subspace, dtype " in done.stderr
    assert ("dtype fp32 (auto: this machine has no CUDA GPU" if not torch.cuda.is_available() else "(auto: cuda)") \
        in done.stderr


def test_the_console_script_says_one_sentence_or_a_traceback_with_debug(tmp_path):
    done = run_swarm("local", "--steps", "0", tmp_path=tmp_path)
    assert done.returncode == 2 and _last_error(done) == \
        "error: --steps must be at least 1 (the optimizer steps to train), not 0."
    token = uuid.uuid4().hex
    debug = subprocess.run([SWARM, "local", "--steps", "-5", "--debug"], capture_output=True, text=True, timeout=120,
                           env=dict(os.environ, **{CASE_MARKER: token}))
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "ValueError: --steps" in debug.stderr


def test_a_local_run_says_its_dtype_and_done_only_with_every_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    done = run_swarm("local", "--steps", "1", "--stages", "2", "--checkpoint-dir", str(ck), "--no-dashboard",
                     "--quiet", "--threads", "1", tmp_path=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "dtype fp32 (auto: cpu)" in done.stdout.splitlines()[0]
    assert "done: 1 steps" in done.stdout and f"checkpoints of every stage written to {ck}" in done.stdout
    assert sorted(p.name.split("-")[-1] for p in ck.glob("*.pt")) == ["stage0.pt", "stage1.pt"]


def test_a_checkpoint_write_that_fails_late_is_an_error_never_done(tmp_path):
    """The folder passes the check at start, then becomes a file while the swarm trains: every peer's
    final write fails, each says so, and `swarm local` ends with an error naming the stages and the
    logs it kept, not with "done"."""
    ck, work = tmp_path / "ck", tmp_path / "work"
    token = uuid.uuid4().hex
    env = dict(os.environ, **{CASE_MARKER: token, "SWARM_STATE_DIR": str(tmp_path / "state")})
    # 15 steps: the folder becomes a file right after the first, while the rest train (~0.2 s each at the least);
    # fewer than the peers' --checkpoint-every (50), so the only writes are the final ones the docstring means
    proc = subprocess.Popen([SWARM, "local", "--steps", "15", "--stages", "2", "--checkpoint-dir", str(ck),
                             "--workdir", str(work), "--no-dashboard", "--quiet", "--threads", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while '"event": "step"' not in ((work / "stage0.jsonl").read_text() if (work / "stage0.jsonl").exists()
                                         else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "the swarm never stepped"
            time.sleep(0.2)  # poll the head's report for its first step
        ck.rmdir()
        ck.write_text("not a folder any more\n")
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert "done:" not in out
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: the run trained") and "stages 0, 1 wrote no checkpoint to" in last, err[-3000:]
    assert "could not write stage 1's checkpoint" in (work / "stage1.log").read_text()
    assert any(e.get("event") == "checkpoint_error" for e in map(json.loads, (work / "stage1.jsonl").read_text()
                                                               .splitlines()))
    deadline = time.monotonic() + 15
    while (left := _marked(token)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes {left} were left behind"
