"""Ctrl+C or SIGTERM stops everything cleanly: on `swarm local` (peers, coordinator and their p2pd)
and on a head started by hand (its checkpoint written, its p2pd gone, no asyncio error on the way out)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from peer.runner.checkpoint import checkpoint_path, load_checkpoint
from tests.conftest import MARKER, marked_p2pd
from tests.e2e.conftest import wait_for_event

# what an unclean exit leaves in a log: asyncio's "Task/_GatheringFuture exception was never
# retrieved" for a task or gather left behind, and any traceback
UNCLEAN = ("exception was never retrieved", "Traceback")


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if text.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _live_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) processes of this process group: a peer, its DHT process, reaper and p2pd."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[2]) == pgid:
                found.append(int(entry))
    return found


def _assert_clean(name: str, text: str) -> None:
    for bad in UNCLEAN:
        assert bad not in text, f"{name} has {bad!r}:\n{text[-3000:]}"


def test_interrupted_local_swarm_leaves_nothing_behind(tmp_path):
    workdir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    marker = os.environ[MARKER]
    before = marked_p2pd(marker)
    proc = subprocess.Popen([sys.executable, "-m", "swarm.cli", "local", "--steps", "100000", "--workdir", str(workdir),
                             "--no-dashboard", "--quiet", "--threads", "1", "--checkpoint-dir", str(ckpt)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        report = workdir / "stage0.jsonl"
        while not (report.exists() and report.read_text().count('"event": "step"') >= 2):
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            assert time.monotonic() < deadline, "the local swarm never trained"
            time.sleep(0.2)  # poll interval of the head's report
        started = marked_p2pd(marker) - before
        assert len(started) == 4, f"expected a p2pd for the coordinator and each of 3 peers, found {started}"

        proc.send_signal(signal.SIGINT)  # what Ctrl+C in a terminal does
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 130, out[-3000:]
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 15
    while (left := (marked_p2pd(marker) - before) | set(_processes_mentioning(str(workdir)))) \
            and time.monotonic() < deadline:
        time.sleep(0.1)  # poll until the children have been reaped
    assert not left, f"processes left behind after Ctrl+C: {sorted(left)}"
    # `swarm local` stops its processes with SIGTERM: each peer saved its stage, and nothing was left unread
    _assert_clean("swarm local's output", out)
    for log in sorted(workdir.glob("*.log")):
        _assert_clean(log.name, log.read_text(errors="replace"))
    run_hash = json.loads((workdir / "coordinator.json").read_text())["run"]
    # the head had done 2 steps; every other stage had applied the first before its share of the second
    steps = [load_checkpoint(checkpoint_path(ckpt, run_hash, stage))["step"] for stage in range(3)]
    assert steps[0] >= 2 and min(steps) >= 1, steps


def test_ctrl_c_on_a_head_saves_its_checkpoint_and_leaves_cleanly(make_swarm, tmp_path):
    """SIGINT (Ctrl+C in the head's terminal) while it drives steps: it leaves, writes its checkpoint
    and exits 0 with no asyncio error, and its DHT process, reaper and p2pd go with it."""
    swarm, ckpt = make_swarm(), tmp_path / "ckpt"
    swarm.start_coordinator(serving=False)
    for s in (1, 2):
        swarm.start_peer(s)
    head = swarm.start_peer(0, "--steps", "100000", "--checkpoint-dir", str(ckpt))
    done = wait_for_event(swarm, "stage0", "step", 180, 2)
    assert len(_live_in_group(head.pid)) >= 3, "the head, its DHT process and p2pd should be running"

    os.kill(head.pid, signal.SIGINT)  # the head itself, as a terminal's Ctrl+C reaches `swarm peer`
    code = head.wait(timeout=60)
    log = (swarm.dir / "stage0.log").read_text(errors="replace")
    assert code == 0, log[-3000:]
    _assert_clean("the head's log", log)
    saved = load_checkpoint(checkpoint_path(ckpt, swarm.run_hash, 0))
    assert saved["step"] >= done[-1]["step"], f"the checkpoint is at step {saved['step']}, behind the steps done"
    assert f"saved stage 0 at step {saved['step']}" in log
    deadline = time.monotonic() + 15
    while (left := _live_in_group(head.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)  # poll until the head's children have exited
    assert not left, f"processes of the head left behind after Ctrl+C: {left}"
