"""A fork server ("zygote") for `python -m swarm.cli ...` processes: pay the imports once.

Every swarm process (peer, coordinator, dashboard) spends ~2.5 CPU-seconds importing torch,
hivemind and scipy before it does anything; `swarm local` and the tests start many of them. The
server is one process that imports all that once, runs no torch op and starts no thread, event
loop or DHT, then forks a child per request. The child becomes what `python -m swarm.cli ARGS`
would be: its own session (setsid), stdin /dev/null, stdout/stderr the caller's open files
(passed as fds), the caller's env (os.environ replaced), sys.argv set, Python `random`, numpy's
global and torch's default CPU generator reseeded from the OS (as a fresh process seeds them; CUDA
is never initialised in the server), SIGINT/SIGTERM as the owner had them; its exit code is the
process's.

The server process is `swarm/launch/fork_server_main.py`. The owner holds one end of a SOCK_SEQPACKET
socketpair; the server's end is its stdin, so the server exits as soon as its owner closes it or
dies (children it started stop then too if they run with SWARM_EXIT_WITH_PARENT: their parent is
the server). A request is one message (JSON argv/env + fds: stdout, stderr, and one end of a
fresh socketpair for the reply). On that reply socket the server sends the child's pid with a
pidfd (so signals never hit a reused pid), then, once it reaps the child, its wait status.
`ForkedProcess` wraps that as a `subprocess.Popen` look-alike (pid, poll, wait, send_signal,
terminate, kill, returncode). The child writes its own command line over the server's padded
argv, so ps and `pgrep -f` show `python -m swarm.cli ARGS` (cut at CMDLINE_ROOM bytes).

Environment variables read at import time (by Python, torch, OpenMP/BLAS, hivemind) cannot
change after the fork: `IMPORT_TIME_ENV` lists their prefixes. A request whose values of those
differ from the server's, or whose cwd differs (with -m, cwd is sys.path[0]), or made after the
server died, gets a plain subprocess instead. SWARM_FORK_SERVER=0 turns the server off.
Differences left: children share the server's str hash seed (PYTHONHASHSEED), the stdin of a
child is /dev/null, not the caller's, and warnings printed while importing go to the server's log.
"""
from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

SWITCH = "SWARM_FORK_SERVER"  # "0": every process is a plain subprocess
IMPORT_TIME_ENV = ("PYTHON", "LD_", "LANG", "LC_", "TMP", "TEMP", "MALLOC_", "OMP_", "GOMP_", "KMP_", "MKL_",
                   "OPENBLAS_", "GOTO", "BLIS_", "NUMEXPR_", "CUDA_", "NCCL_", "TORCH", "PYTORCH_", "HIVEMIND_",
                   "USE_LEGACY_BFLOAT16", "QUANTIZATION_THREADS")
# what torch writes into its own process's environment as it runs (torch._inductor's cache_dir(), called once
# torch._dynamo is in use: a first optimizer step), not a setting the server's imports read: a parent that ran
# such code after starting the server would otherwise get plain processes from then on
WRITTEN_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)
CMDLINE_ROOM = 4096  # bytes of the server's argv a child may show as its command line
ChildOutput = IO | int


def enabled(env: Mapping[str, str] = os.environ) -> bool:
    return env.get(SWITCH, "1") != "0" and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in WRITTEN_BY_TORCH}


def _fd(out: ChildOutput) -> int:
    return out if isinstance(out, int) else out.fileno()


class ForkedProcess:
    """A `subprocess.Popen` look-alike for a child of the fork server (not of this process)."""

    def __init__(self, args: list[str], reply: socket.socket) -> None:
        self.args, self._reply, self.returncode = args, reply, None
        self._lock = threading.Lock()
        msg, fds, _, _ = socket.recv_fds(reply, 4096, 1)
        if not msg:
            raise OSError("the fork server ended before it started the process")
        self.pid: int = json.loads(msg)["pid"]
        self._pidfd = fds[0]

    def _collect(self, timeout: float | None) -> bool:
        """Read the exit status if it comes within `timeout` (None: wait for it); True once known."""
        if self.returncode is not None:
            return True
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            return False
        try:
            if self.returncode is not None:
                return True
            if not select.select([self._reply], [], [], timeout)[0]:
                return False
            msg = self._reply.recv(4096)
            if msg:
                self.returncode = os.waitstatus_to_exitcode(json.loads(msg)["status"])
            elif select.select([self._pidfd], [], [], timeout)[0]:
                self.returncode = 255  # the server is gone: the child (now init's) ended, its status lost
            else:
                return False
            self._reply.close()
            os.close(self._pidfd)
            return True
        finally:
            self._lock.release()

    def poll(self) -> int | None:
        self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._collect(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        if self.returncode is None and getattr(self, "_pidfd", None) is not None:
            os.close(self._pidfd)  # a handle dropped unwaited; the reply socket closes by itself


Process = subprocess.Popen | ForkedProcess


class ForkServer:
    """Owner side: starts the server with `env` in `cwd`; `popen` starts `swarm ARGS` through it
    when it can, else as a plain subprocess; `close` (or the owner's death) ends the server."""

    def __init__(self, env: Mapping[str, str], cwd: str | Path | None = None, log: str | Path | None = None) -> None:
        self.env, self.cwd = dict(env), os.path.abspath(cwd or os.getcwd())
        self._control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with open(log or os.devnull, "w") as err:
            # the padding is argv room that each child overwrites with its own command line
            self._proc = subprocess.Popen([sys.executable, "-m", "swarm.launch.fork_server_main", " " * CMDLINE_ROOM],
                                          stdin=theirs, stdout=err, stderr=err, env=self.env, cwd=self.cwd)
        theirs.close()
        self._lock = threading.Lock()

    def usable_for(self, env: Mapping[str, str], cwd: str | Path | None) -> bool:
        return (self._proc.poll() is None and os.path.abspath(cwd or os.getcwd()) == self.cwd
                and import_time_env(env) == import_time_env(self.env))

    def popen(self, args: Sequence[str], stdout: ChildOutput, stderr: ChildOutput | None = None,
              env: Mapping[str, str] | None = None, cwd: str | Path | None = None, module: str = "swarm.cli"
              ) -> Process:
        """`python -m MODULE ARGS` (MODULE's `main(argv)`) in a new session; stderr may be
        subprocess.STDOUT (the default)."""
        env = dict(os.environ if env is None else env)
        out = _fd(stdout)
        err = out if stderr in (None, subprocess.STDOUT) else _fd(stderr)
        if self.usable_for(env, cwd):
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            request = json.dumps({"argv": list(args), "env": env, "module": module}).encode()
            try:
                with self._lock:
                    socket.send_fds(self._control, [request], [out, err, theirs.fileno()])
                theirs.close()
                return ForkedProcess([sys.executable, "-m", module, *args], ours)
            except OSError:  # the server died (or failed to start): the plain way below
                ours.close()
                theirs.close()
        return subprocess.Popen([sys.executable, "-m", module, *args], stdout=out, stderr=err, env=env,
                                cwd=cwd, start_new_session=True)

    def close(self, timeout: float = 10.0) -> None:
        """End the server. Children still running then stop if they run with SWARM_EXIT_WITH_PARENT
        (their parent is gone), else they go on as init's and their exit status is lost."""
        if self._control.fileno() >= 0:
            self._control.close()
        try:
            self._proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
