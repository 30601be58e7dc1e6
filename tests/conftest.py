"""Guards for every test: no p2pd started by a test module may outlive that module, tiny
matrices run on one torch thread, the swarm's state folder is a temporary one, and the fast
lane (`pytest -m "not e2e"`) stays in-process. Also the session's oracle runs (`oracle_runs`):
the in-process pipeline trained once per run spec, for every test that compares with it.

Every p2pd this session starts inherits an environment marker (hivemind copies os.environ
into the daemon's environment), so the check sees our daemons, orphans included, and never
those of another test session that happens to run on the same machine.
"""

from __future__ import annotations

import multiprocessing.process
import os
import signal
import subprocess
import time
import uuid

import pytest

MARKER = "SUBSPACE_SWARM_TEST_SESSION"


def marked_p2pd(token: str) -> set[int]:
    """Live (non-zombie) p2pd processes carrying this session's marker."""
    needle = f"{MARKER}={token}".encode()
    found: set[int] = set()
    if not os.path.isdir("/proc"):
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            if stat[stat.index("(") + 1 : stat.rindex(")")] != "p2pd" or stat[stat.rindex(")") + 2] in "ZX":
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.add(int(entry))
        except (OSError, ValueError):
            continue  # the process ended while we looked, or is not ours to read
    return found


def pytest_sessionstart(session):
    """Build matplotlib's font cache before any test runs: on a machine that has never drawn a plot its
    first import runs `fc-list`, which would count as a process started by whichever unit test plots first."""
    try:
        import matplotlib.font_manager  # noqa: F401
    except ImportError:
        pass


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test not marked e2e that starts a process (a subprocess, a DHT, p2pd, worker processes) fails,
    so the marker keeps one meaning: `-m "not e2e"` is units and in-memory swarms, nothing else.
    Fixtures are covered too: a module fixture is set up inside its first test's protocol."""
    if item.get_closest_marker("e2e"):
        return (yield)

    def refuse(*args, **kwargs):
        raise AssertionError(f"{item.nodeid} starts a process; mark it @pytest.mark.e2e (see setup.cfg).")

    saved = subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start
    subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start = refuse, refuse
    try:
        return (yield)
    finally:
        subprocess.Popen._execute_child, multiprocessing.process.BaseProcess.start = saved


@pytest.fixture(scope="session", autouse=True)
def p2pd_marker():
    token = uuid.uuid4().hex
    previous = os.environ.get(MARKER)
    os.environ[MARKER] = token
    yield token
    if previous is None:
        os.environ.pop(MARKER, None)
    else:
        os.environ[MARKER] = previous


@pytest.fixture(scope="session", autouse=True)
def state_dir_in_tmp(tmp_path_factory):
    """Keys and identities that commands keep by default go to a temporary folder, never the
    real ~/.local/share (subprocesses inherit the variable)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SWARM_STATE_DIR", str(tmp_path_factory.mktemp("swarm-state") / "state"))
        yield


@pytest.fixture(scope="module", autouse=True)
def no_leftover_p2pd(p2pd_marker):
    before = marked_p2pd(p2pd_marker)
    yield
    deadline = time.monotonic() + 10.0
    while (left := marked_p2pd(p2pd_marker) - before) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        for pid in left:  # ours, and leaked: end them so later modules start clean
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        pytest.fail(f"p2pd processes {sorted(left)} outlived the test module that started them.")


def pytest_asyncio_loop_factories(config, item):
    """The loop of each async test: asyncio's, except for a test marked `idle_clock`, whose loop skips the waits
    in which nothing can happen (tests/idle_clock.py): the in-memory swarms' deadlines and back-offs."""
    import asyncio

    if item.get_closest_marker("idle_clock") is None:
        return {"asyncio": asyncio.new_event_loop}
    from tests.idle_clock import idle_clock

    return {"idle_clock": idle_clock()}


@pytest.fixture(scope="session")
def oracle_runs():
    """The in-process oracle's runs, each trained once in the session (tests/oracle_runs.py)."""
    from tests.oracle_runs import OracleRuns

    return OracleRuns()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: extra threads only add contention on a busy 2-core CI box, and one thread
    makes fp32 sums come out in the same order as in the swarm's single-threaded peers."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def session_fork_server(tmp_path_factory):
    """One fork server (swarm/launch/fork_server.py) for the session's local swarms: each swarm process
    forked from it skips ~2.5 CPU-s of imports. None with SWARM_FORK_SERVER=0."""
    from swarm.launch import fork_server
    from swarm.launch.fork_server import ForkServer
    from swarm.local import child_env

    # any in-process torch run (an oracle, a bench's curves) sets TORCHINDUCTOR_CACHE_DIR in os.environ (torch
    # _inductor's cache_dir()), which is part of the server's import-time environment: set after the server
    # started, every later swarm of the worker found the server's environment stale and started one of its own
    # (~2.7 CPU-s a swarm). Set now, to the value torch would set, before the server starts.
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:  # another torch: nothing to pin (at worst swarms start their own servers again)
        pass
    else:
        cache_dir()
    env = child_env(threads=1)
    if not fork_server.enabled(env):
        yield None
        return
    with ForkServer(env, log=tmp_path_factory.mktemp("fork-server") / "server.log") as server:
        yield server


@pytest.fixture(autouse=True)
def _every_local_swarm_forks_from_the_session_server(request, monkeypatch):
    """A LocalSwarm that an e2e test builds (itself, through `make_swarm`, or inside a benchmark's
    `run_local`) forks its processes from the session's server, instead of starting one of its own
    (~2.7 CPU-s each). Only e2e tests start processes; a test marked `own_fork_server` keeps its own."""
    if not request.node.get_closest_marker("e2e") or request.node.get_closest_marker("own_fork_server"):
        return
    server = request.getfixturevalue("session_fork_server")
    if server is None:
        return
    from swarm.local import LocalSwarm

    init = LocalSwarm.__init__

    def shared(self, opts, placement=None, fork_server=None) -> None:
        init(self, opts, placement, fork_server or server)
    monkeypatch.setattr(LocalSwarm, "__init__", shared)
