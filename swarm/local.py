"""`swarm local`: a whole swarm on one machine, as separate OS processes on loopback.

It starts a coordinator and one peer per stage (each in its own process group, so that it
and its p2pd can be stopped together), shows a progress bar fed by the head's report,
writes the metrics JSON, and on finish, error or Ctrl+C stops everything it started. Reading
the peers' reports back (progress, metrics) is in `swarm/local_reports.py`; what a local run can be told
(`LocalOptions`, its flags) in `swarm/local_options.py`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from peer.data.run_tokens import check_data_flags, recorded_tokens, with_tokens
from swarm.launch import fork_server
from swarm.launch.fork_server import ForkServer, Process
from swarm.local_options import LocalOptions, parse_devices
from swarm.local_reports import LocalSwarmError, RunReports

log = logging.getLogger(__name__)


def dashboard_port(preferred: int, host: str = "127.0.0.1") -> tuple[int, str | None]:
    """`preferred` if it is free, else a free port and the sentence that says so."""
    def bind(port: int) -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds: TIME_WAIT is not "taken"
            s.bind((host, port))
            return s.getsockname()[1]
    try:
        return bind(preferred), None
    except OSError:
        port = bind(0)
        return port, f"port {preferred} is taken; the dashboard uses port {port} instead."


class Placement(Protocol):
    """Where each process of a local swarm runs: `prefix(name)` goes in front of its command and
    `host(name)` is the address it listens on (and, for the coordinator, the one peers dial);
    `name` is the process name (coordinator, stage0, ...). `Loopback` is the default;
    `swarm/net/namespaces.py` puts each process in its own network namespace."""

    def prefix(self, name: str) -> list[str]: ...

    def host(self, name: str) -> str: ...


class Loopback:
    """Every process on this host's loopback, started as is."""

    def prefix(self, name: str) -> list[str]:
        return []

    def host(self, name: str) -> str:
        return "127.0.0.1"


def _python_cmd(*args: str, module: str = "swarm.cli") -> list[str]:
    return [sys.executable, "-m", module, *args]


def child_env(threads: int) -> dict[str, str]:
    """The environment of a local swarm's processes, each on `threads` torch threads."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["OMP_NUM_THREADS"] = str(threads)
    env["SWARM_TORCH_THREADS"] = str(threads)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    env["SWARM_EXIT_WITH_PARENT"] = "1"  # a child ends with this launcher, however the launcher ends
    return env


class LocalSwarm(RunReports):
    def __init__(self, opts: LocalOptions, placement: Placement | None = None,
                 fork_server: ForkServer | None = None) -> None:
        """`fork_server`: one to share (e.g. a test session's; its owner closes it), else this
        swarm starts its own with its first process and closes it in `stop`."""
        check_data_flags(opts.data, opts.tokens)
        if opts.tokens and recorded_tokens(opts.spec) is None:  # the spec the peers build: the tokenizer's vocab
            opts = dataclasses.replace(opts, spec=with_tokens(opts.spec, opts.tokens))
        self.opts = opts
        self.placement = placement or Loopback()
        self._peers_started = 0
        self.procs: list[tuple[str, Process]] = []
        self._shared_server = fork_server
        self._fork_server: ForkServer | None = None  # its own, started with the first process it can start
        self.maddrs: list[str] = []
        self._serving_file: Path | None = None  # the coordinator's "it serves" file, once one was started
        self.run_hash = ""  # the signed spec's (it names the coordinator's key), set once the coordinator serves
        self.dashboard_url: str | None = None
        self._tmp: str | None = None
        if opts.workdir:
            self.dir = Path(opts.workdir)
            self.dir.mkdir(parents=True, exist_ok=True)
        else:
            self._tmp = tempfile.mkdtemp(prefix="swarm-local-")  # removed by `cleanup`, kept if the run failed
            self.dir = Path(self._tmp)

    # ---------------------------------------------------------------- processes
    def _env(self) -> dict[str, str]:
        n_procs = self.opts.spec.n_stages * self.opts.replicas + 1
        return child_env(self.opts.threads or max(1, (os.cpu_count() or 1) // n_procs))

    def spawn(self, name: str, args: list[str], prefix: Sequence[str] = (), module: str = "swarm.cli") -> Process:
        """Start `swarm ARGS` as `name` (log: <name>.log), behind a command `prefix` if given, e.g.
        `ip netns exec NS` to run it in a network namespace (the prefix must exec the command).
        Without a prefix it is forked by the fork server (swarm/launch/fork_server.py; SWARM_FORK_SERVER=0: not).
        `module`: run `python -m MODULE ARGS` instead, a module whose `main(argv)` takes `swarm`'s arguments
        (e.g. a program that embeds a peer through `run_peer`'s extension point)."""
        prefix = [*prefix, *self.placement.prefix(name)]
        env = self._env()
        with open(self.dir / f"{name}.log", "w") as logf:
            if not prefix and fork_server.enabled(env):
                server = self._shared_server
                if server is None or not server.usable_for(env, None):
                    if self._fork_server is None:
                        self._fork_server = ForkServer(env, log=self.dir / "fork_server.log")
                    server = self._fork_server
                proc = server.popen(args, stdout=logf, env=env, module=module)
            else:
                proc = subprocess.Popen([*prefix, *_python_cmd(*args, module=module)], stdout=logf,
                                        stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def _log_tail(self, name: str, chars: int = 2000) -> str:
        try:
            return (self.dir / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def _check_alive(self) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise LocalSwarmError(f"{name} exited with code {proc.returncode}; its log ({self.dir}/{name}.log) "
                                      f"ends with:\n{self._log_tail(name)}")

    def wait_for_file(self, path: Path, what: str, timeout: float, name: str | None = None) -> None:
        """Poll until another process writes `path`; past `timeout`, have the processes write their stacks
        (dump_stacks) and fail with the tail of `name`'s log, so that a report from a machine one cannot
        log into still says where the process was stuck."""
        deadline = time.monotonic() + timeout
        while not (path.exists() and path.stat().st_size > 0):
            self._check_alive()
            if time.monotonic() > deadline:
                if name:
                    self.dump_stacks()
                tail = f" Its log ({name}.log) ends with:\n{self._log_tail(name, 6000)}" if name else ""
                raise LocalSwarmError(f"{what} did not come up within {timeout:g} s; see the logs in {self.dir}.{tail}")
            time.sleep(0.1)  # poll interval for a file another process writes

    def start_coordinator(self, *extra: str, module: str = "swarm.cli", serving: bool = True) -> list[str]:
        """Start the coordinator (with `extra` flags, e.g. --private) and return its multiaddrs once it serves
        (`module`: see `spawn`). `serving=False`: return as soon as its node listens, ~2 s sooner (the seat's
        settle), so that peers started next come up meanwhile (they wait for the run spec); `wait_serving` waits
        for the rest."""
        spec_path = self.dir / "run.json"
        self.opts.spec.save(spec_path)
        maddrs_file, listening_file = self.dir / "coordinator.json", self.dir / "coordinator.listening.json"
        for f in (maddrs_file, listening_file):
            f.unlink(missing_ok=True)  # a workdir may be reused: never read an old run's address
        key = ["--key", self.opts.coordinator_key] if self.opts.coordinator_key else []
        data = ["--data", self.opts.data] if self.opts.data else []  # recorded in the run spec (swarm eval reads it)
        data += ["--data-binary-ok"] if self.opts.data and self.opts.data_binary_ok else []
        data += ["--tokens", os.path.abspath(self.opts.tokens)] if self.opts.tokens else []
        self.spawn("coordinator", ["coordinator", "--run-spec", str(spec_path), "--host-maddrs",
                                   f"/ip4/{self.placement.host('coordinator')}/tcp/0", "--maddrs-file",
                                   str(maddrs_file), "--listening-file", str(listening_file),
                                   "--state-dir", str(self.dir), "--id-work-bits",
                                   str(self.opts.id_work_bits), *key, *data, *(["--compile"] if self.opts.compile
                                                                                else []),
                                   *(["--record-ttl", str(self.opts.record_ttl)] if self.opts.record_ttl else []),
                                   # every peer here is the user's own process: trusted, as powersgd needs
                                   *(["--unchecked-powersgd"] if self.opts.spec.replica_sync == "powersgd" else []),
                                   *extra], module=module)
        self._serving_file = maddrs_file
        self.wait_for_file(maddrs_file if serving else listening_file, "the coordinator", 90, "coordinator")
        served = json.loads((maddrs_file if serving else listening_file).read_text())
        self.maddrs, self.run_hash = served["maddrs"], served["run"]
        return self.maddrs

    def wait_serving(self, timeout: float = 90.0) -> None:
        """After `start_coordinator(serving=False)`: wait until the coordinator holds the seat and the run spec
        is published."""
        if self._serving_file is not None:
            self.wait_for_file(self._serving_file, "the coordinator", timeout, "coordinator")

    def device_for(self, index: int) -> str:
        """The device of the index-th peer started: `--devices` round robin, else `--device`."""
        devices = parse_devices(self.opts.devices) or [self.opts.device]
        return devices[index % len(devices)]

    def start_peer(self, stage: int | str, *extra: str, name: str | None = None, module: str = "swarm.cli"
                   ) -> Process:
        """Start `swarm peer` for `stage` (or "auto"); its report goes to <name>.jsonl in the workdir.
        Peers take the devices of `--devices` in the order they are started (`module`: see `spawn`)."""
        name = name or f"stage{stage}"
        (self.dir / f"{name}.jsonl").unlink(missing_ok=True)
        device = self.device_for(self._peers_started)
        self._peers_started += 1
        args = ["peer", "--initial-peers", self.maddrs[0], "--stage", str(stage), "--host-maddrs",
                f"/ip4/{self.placement.host(name)}/tcp/0", "--device", device,
                "--report", str(self.dir / f"{name}.jsonl"), "--latency", self.opts.latency]
        if self.opts.bandwidth:
            args += ["--bandwidth", self.opts.bandwidth]
        if self.opts.data:
            args += ["--data", self.opts.data] + (["--data-binary-ok"] if self.opts.data_binary_ok else [])
        if self.opts.tokens:  # every peer: only a head reads it, and any peer may move to stage 0
            args += ["--tokens", os.path.abspath(self.opts.tokens)]
        if self.opts.checkpoint_dir:
            args += ["--checkpoint-dir", self.opts.checkpoint_dir]
        if self.opts.trace_frames:
            extra = (*extra, "--trace-frames", str(Path(self.opts.trace_frames).resolve() / f"{name}.frames.jsonl"))
        return self.spawn(name, args + list(extra) + self.opts.extra_peer_args, module=module)

    def start_dashboard(self, port: int | None = None, *extra: str, timeout: float = 90.0) -> str:
        """Start `swarm dashboard` on the coordinator (a free port if `port` is taken); returns its URL
        once it serves."""
        self.wait_serving()  # it reads the run spec at once
        port, note = dashboard_port(self.opts.dashboard_port if port is None else port)
        if note:
            print(note, flush=True)
        url_file = self.dir / "dashboard.json"
        url_file.unlink(missing_ok=True)
        self.spawn("dashboard", ["dashboard", "--initial-peers", self.maddrs[0], "--port", str(port),
                                 "--url-file", str(url_file), *extra])
        self.wait_for_file(url_file, "the dashboard", timeout, "dashboard")
        self.dashboard_url = json.loads(url_file.read_text())["url"]
        return self.dashboard_url

    @staticmethod
    def peer_name(stage: int, replica: int = 0) -> str:
        return f"stage{stage}" if replica == 0 else f"stage{stage}r{replica}"

    def head_names(self) -> list[str]:
        return [self.peer_name(0, r) for r in range(self.opts.replicas)]

    def start(self) -> list[str]:
        maddrs = self.start_coordinator(serving=False)  # the peers come up while the coordinator takes the seat
        for r in range(self.opts.replicas):
            for s in range(self.opts.spec.n_stages):
                self.start_peer(s, *(["--steps", str(self.opts.steps)] if s == 0 else []), name=self.peer_name(s, r))
        self.wait_serving()
        if self.opts.dashboard:  # after the peers, so that they start while it comes up
            print(f"dashboard: {self.start_dashboard()}", flush=True)
        return maddrs

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM every process (each stops its own DHT and p2pd), wait, then SIGKILL each
        process group, which takes whatever is left (p2pd included)."""
        for _, proc in self.procs:
            if proc.poll() is None:
                # the process, not its group: a DHT child or p2pd killed under a peer's feet makes
                # its clean shutdown wait out hivemind's grace periods
                try:
                    proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for _, proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _, proc in self.procs:
            _signal_group(proc, signal.SIGKILL)  # also reaps any p2pd its peer failed to stop
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                log.error("process %d did not exit after SIGKILL", proc.pid)
        if self._fork_server is not None:  # last: its children stop when it goes (SWARM_EXIT_WITH_PARENT)
            self._fork_server.close()
            self._fork_server = None

    def wait_for_head(self, timeout: float = 30.0) -> None:
        for name, proc in self.procs:
            if name in self.head_names():
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    log.warning("the head did not exit %g s after its last step; stopping it", timeout)

    def missing_checkpoints(self, since: float = 0.0) -> list[int]:
        """The stages of which `--checkpoint-dir` holds no checkpoint of this run written after `since` (a time.time();
        an older file of the same run, from a reused folder, does not count) ([] without the flag)."""
        if not self.opts.checkpoint_dir:
            return []
        from peer.runner.checkpoint import checkpoint_path

        def written(stage: int) -> bool:
            path = checkpoint_path(self.opts.checkpoint_dir, self.run_hash or self.opts.spec.run_hash, stage)
            try:
                return path.stat().st_mtime >= since - 1.0  # a coarse file-system clock
            except OSError:
                return False
        return [s for s in range(self.opts.spec.n_stages) if not written(s)]

    def cleanup(self, keep_logs: bool = False) -> None:
        """Remove the temporary folder, unless `keep_logs` (a failed run: the error names its logs)."""
        if self._tmp is None:
            return
        if keep_logs:
            print(f"the logs of this run are kept in {self.dir}", file=sys.stderr, flush=True)
            self._tmp = None  # never removed: the user reads them after this process ends
            return
        shutil.rmtree(self._tmp, ignore_errors=True)
        self._tmp = None

def _signal_group(proc: Process, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_local(opts: LocalOptions, placement: Placement | None = None) -> dict:
    """Run a local swarm to completion; always stops every process it started. The result's
    `missing_checkpoints` lists the stages that wrote none although `--checkpoint-dir` asked; a run that
    failed (or missed one) keeps its logs, even in a temporary folder (`logs` says where)."""
    swarm = LocalSwarm(opts, placement)
    ok, started = False, time.time()
    try:
        swarm.start()
        steps = swarm.follow()
        swarm.wait_for_head()  # the head leaves by itself after its last step; the others are stopped
        swarm.stop()  # peers write their wire counters as they leave
        result = swarm.metrics(steps)
        if opts.metrics_out:
            Path(opts.metrics_out).write_text(json.dumps(result, indent=1) + "\n")
        result["missing_checkpoints"] = swarm.missing_checkpoints(since=started)
        result["logs"] = str(swarm.dir)
        ok = bool(steps) and not result["missing_checkpoints"]
        return result
    except KeyboardInterrupt:  # the user stopped it: nothing failed, the logs need not stay
        ok = True
        raise
    finally:
        swarm.stop(grace=5.0)
        swarm.cleanup(keep_logs=not ok)
