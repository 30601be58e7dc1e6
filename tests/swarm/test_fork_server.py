"""The fork server's children behave as `python -m ...` processes would: own pid and session,
their log, their exit code, death by signal, their own random numbers; and the server leaves
nothing behind, even when its owner is killed outright."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from swarm.launch.fork_server import ForkedProcess, ForkServer
from tests.e2e.processes import group_members

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests.swarm.fork_probe"


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


@pytest.fixture(scope="module")
def server():
    with ForkServer(child_env(), cwd=ROOT) as fs:
        yield fs


def start(fs: ForkServer, log: Path, *args: str, **env: str) -> ForkedProcess | subprocess.Popen:
    with open(log, "w") as f:
        return fs.popen(list(args), stdout=f, env=child_env(**env), cwd=ROOT, module=PROBE)


def report(log: Path, timeout: float = 60.0) -> dict:
    """The probe's JSON line, once it is written."""
    deadline = time.monotonic() + timeout
    while not (lines := log.read_text().splitlines()):
        assert time.monotonic() < deadline, f"nothing in {log}"
        time.sleep(0.05)  # poll a file another process writes
    return json.loads(lines[0])


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def test_child_has_its_own_pid_session_log_env_and_exit_code(server, tmp_path):
    proc = start(server, tmp_path / "a.log", "3", PROBE="hello")
    assert isinstance(proc, ForkedProcess)
    assert proc.wait(timeout=60) == 3 and proc.poll() == 3 and proc.returncode == 3
    me = report(tmp_path / "a.log")
    assert me["pid"] == proc.pid != os.getpid()
    assert me["sid"] == me["pgid"] == proc.pid  # a new session, as start_new_session=True gives
    assert me["ppid"] == server._proc.pid  # not ours: the server reaps it and reports its status
    assert me["probe_env"] == "hello" and me["cwd"] == str(ROOT) and me["stdin"] == os.devnull
    assert me["argv0"].endswith("fork_probe.py") and me["threads"] == 1
    assert me["dynamo"]  # preloaded: a peer's first torch.optim call does not import ~800 modules (1.5-3 CPU-s)
    assert me["cmdline"] == [sys.executable, "-m", PROBE, "3"]  # what ps and pgrep -f show
    assert (tmp_path / "a.log").read_text().splitlines()[1] == "to stderr"  # stderr=STDOUT, as Popen


def test_children_draw_their_own_random_numbers(server, tmp_path):
    forked = [start(server, tmp_path / f"{i}.log") for i in range(2)]
    with open(tmp_path / "plain.log", "w") as f:
        plain = subprocess.Popen([sys.executable, "-m", PROBE], stdout=f, stderr=subprocess.STDOUT,
                                 env=child_env(), cwd=ROOT)
    assert [p.wait(timeout=60) for p in [*forked, plain]] == [0, 0, 0]
    a, b, fresh = report(tmp_path / "0.log"), report(tmp_path / "1.log"), report(tmp_path / "plain.log")
    assert a["random"] != b["random"] and a["numpy"] != b["numpy"]
    assert a["torch_seed"] != b["torch_seed"] and a["torch"] != b["torch"]  # seeded from the OS, as fresh ones
    assert a["sigint"] == fresh["sigint"] and a["sigterm"] == fresh["sigterm"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT])
def test_signals_end_a_child_as_they_end_a_plain_process(server, tmp_path, sig):
    if sig == signal.SIGINT and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        pytest.skip("this test process ignores SIGINT (a background job), so do its children, plain or forked")
    forked = start(server, tmp_path / "forked.log", "wait")
    with open(tmp_path / "plain.log", "w") as f:
        plain = subprocess.Popen([sys.executable, "-m", PROBE, "wait"], stdout=f, stderr=subprocess.STDOUT,
                                 env=child_env(), cwd=ROOT, start_new_session=True)
    codes = []
    for proc, log in ((forked, "forked.log"), (plain, "plain.log")):
        report(tmp_path / log)  # up and waiting
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=0.2)
        assert proc.poll() is None
        proc.send_signal(sig)
        codes.append(proc.wait(timeout=30))
    assert codes[0] == codes[1] == -sig  # SIGINT too: an uncaught KeyboardInterrupt ends by SIGINT
    assert gone(forked.pid)
    forked.send_signal(signal.SIGTERM)  # a signal to an ended child goes nowhere (no reused pid), no error


def test_a_child_killed_holding_hivemind_locks_stalls_no_later_child(server, tmp_path):
    """hivemind makes multiprocessing locks at import (MPFuture's, around every DHT result); a fork
    would share the server's with every child, so one peer killed while it held one (or blocked holding
    it) stalled every process started after it: a coordinator never came up. Each child has its own."""
    holder = start(server, tmp_path / "hold.log", "hold")
    held = report(tmp_path / "hold.log")["locks"]
    assert held and all(held.values()), held
    holder.kill()
    assert holder.wait(timeout=30) == -signal.SIGKILL
    later = start(server, tmp_path / "grab.log", "grab")
    assert isinstance(later, ForkedProcess) and later.wait(timeout=60) == 0
    assert report(tmp_path / "grab.log")["locks"] == dict.fromkeys(held, True)


def test_an_import_time_variable_that_differs_gets_a_plain_process(server, tmp_path):
    proc = start(server, tmp_path / "omp.log", OMP_NUM_THREADS="2")
    assert isinstance(proc, subprocess.Popen)
    assert proc.wait(timeout=60) == 0 and report(tmp_path / "omp.log")["ppid"] == os.getpid()


def test_a_variable_torch_writes_for_itself_still_gets_a_forked_child(server, tmp_path):
    """torch._inductor sets TORCHINDUCTOR_CACHE_DIR in its process once torch._dynamo runs (an optimizer's
    first call): a test process or launcher that trained after starting the server still forks its children."""
    proc = start(server, tmp_path / "cache.log", "0", TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"))
    assert isinstance(proc, ForkedProcess)
    assert proc.wait(timeout=60) == 0 and report(tmp_path / "cache.log")["ppid"] == server._proc.pid


def test_handles_keep_working_when_the_server_dies_and_later_processes_start_plainly(tmp_path):
    with ForkServer(child_env(), cwd=ROOT) as fs:
        child = start(fs, tmp_path / "child.log", "wait")
        report(tmp_path / "child.log")
        fs._proc.kill()
        fs._proc.wait()
        t0 = time.monotonic()
        assert child.poll() is None and time.monotonic() - t0 < 1.0  # alive (now init's); poll does not block
        child.kill()  # the pidfd still reaches it
        assert child.wait(timeout=30) == 255 and gone(child.pid)  # its exit status went with the server
        later = start(fs, tmp_path / "later.log", "4")
        assert isinstance(later, subprocess.Popen) and later.wait(timeout=60) == 4


OWNER = textwrap.dedent("""
    import json, os, sys, threading
    from swarm.launch.fork_server import ForkServer
    out, env = sys.argv[1], dict(os.environ, SWARM_EXIT_WITH_PARENT="1")
    fs = ForkServer(env, log=out + "/server.log")
    procs = []
    for name in ("a", "b"):
        with open(f"{out}/{name}.log", "w") as log:
            procs.append(fs.popen(["coordinator", "--host-maddrs", "/ip4/127.0.0.1/tcp/0", "--maddrs-file",
                                   f"{out}/{name}.json", "--state-dir", f"{out}/{name}"], stdout=log, env=env))
    holder = os.fork()  # a process of the owner's that keeps its end of the server's socket open
    if holder == 0:
        threading.Event().wait()
    print(json.dumps({"server": fs._proc.pid, "children": [p.pid for p in procs], "holder": holder}), flush=True)
    threading.Event().wait()  # until killed
""")


def test_coordinators_differ_and_nothing_outlives_an_owner_killed_outright(tmp_path):
    """Two coordinators forked by one server serve with their own peer ids and ports; SIGKILL the
    owner (while a process it forked still holds its end of the server's socket) and the server,
    the coordinators, their DHT processes and p2pd all go."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path)], stdout=subprocess.PIPE,
                             env=child_env(), cwd=ROOT, start_new_session=True)
    try:
        pids = json.loads(owner.stdout.readline())
        files = [tmp_path / "a.json", tmp_path / "b.json"]
        deadline = time.monotonic() + 120
        while not all(f.exists() and f.stat().st_size for f in files):
            assert time.monotonic() < deadline, (tmp_path / "a.log").read_text()[-2000:]
            time.sleep(0.1)  # poll files the coordinators write
        a, b = (json.loads(f.read_text())["maddrs"][0] for f in files)
        assert a.split("/p2p/")[1] != b.split("/p2p/")[1] and a.split("/tcp/")[1] != b.split("/tcp/")[1]
        groups = {pid: [p for p, _ in group_members(pid)] for pid in pids["children"]}
        assert all(len(members) >= 2 for members in groups.values()), groups  # coordinator, DHT, p2pd, ...
    finally:
        owner.kill()
        owner.wait()
    try:
        deadline = time.monotonic() + 30
        while not gone(pids["server"]) or any(group_members(pid) for pid in pids["children"]):
            assert time.monotonic() < deadline, {pid: group_members(pid) for pid in pids["children"]}
            time.sleep(0.1)  # poll the process table
    finally:
        os.kill(pids["holder"], signal.SIGKILL)
    assert "stopping" in (tmp_path / "a.log").read_text()  # it noticed its parent (the server) go


@pytest.mark.own_fork_server  # its own server, which its stop must end
def test_a_local_swarm_forks_its_processes_and_stop_ends_its_server(tmp_path, monkeypatch):
    from protocol.spec import preset
    from swarm.local import LocalOptions, LocalSwarm
    swarm = LocalSwarm(LocalOptions(preset("tiny"), workdir=str(tmp_path), threads=1))
    forked = swarm.spawn("id", ["identity", str(tmp_path / "peer.id")])
    monkeypatch.setenv("SWARM_FORK_SERVER", "0")
    plain = swarm.spawn("id2", ["identity", str(tmp_path / "peer2.id")])
    assert isinstance(forked, ForkedProcess) and isinstance(plain, subprocess.Popen)
    assert forked.wait(timeout=60) == 0 and plain.wait(timeout=60) == 0
    ids = [(tmp_path / f"{name}.log").read_text().split()[0] for name in ("id", "id2")]
    assert ids[0] != ids[1] and all(i.startswith("12D3KooW") for i in ids)
    server = swarm._fork_server._proc.pid
    swarm.stop()
    assert gone(server) and swarm._fork_server is None
