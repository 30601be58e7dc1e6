"""The coordinators of a churn run with `--coordinator-kills N`: the run's own and a standby, each on a host of
its own; the active one is killed N times and each killed one starts again as a standby.

- The standby: `swarm coordinator --standby --initial-peers <the coordinator> --key <the run's swarm.key>
  --state-dir <a folder of its own>` on the host "standby", started once the swarm trains.
- Which coordinator is active is read from their logs (swarm/coordinator/seat.py's lines, `SeatLog`), never from
  their names: the live process whose last seat line is "this coordinator holds the seat".
- A kill: SIGKILL of that process alone, as the bench kills peers (its DHT child and p2pd must go by themselves:
  swarm/reaper.py), and only while another coordinator stands by. Peers that join from then on join through the
  standby's address (the killed one's is dead).
- After a kill: once another coordinator's log says it holds the seat, and nothing of the killed one is left on
  its host (or `RESTART_AFTER_S` passed), the killed one starts again on its host as a standby, from its own
  state folder (its identity file, so its peer id, is reused), joining through the new holder's address; so
  the next kill has a standby again.

The figures: swarm/bench/churn/seat_report.py.
"""
from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swarm.launch.fork_server import Process
from swarm.local import LocalSwarm, Placement

from .hosts import appended
from .report import StepRecord
from .seat_report import CoordinatorKill, SeatLine, coordinator_summary, seat_lines

RESTART_AFTER_S = 30.0  # a killed coordinator whose host still holds its processes starts again anyway this late
STANDBY = "standby"  # the standby's host (the first coordinator's is LocalSwarm's "coordinator")


class ProcessHosts:
    """A `Placement` that puts a process on the host of another name: a restarted coordinator on its old host."""

    def __init__(self, hosts: Placement) -> None:
        self.hosts, self.of = hosts, {}

    def prefix(self, name: str) -> list[str]:
        return self.hosts.prefix(self.of.get(name, name))

    def host(self, name: str) -> str:
        return self.hosts.host(self.of.get(name, name))


class SeatLog:
    """One coordinator's seat and basis lines (`seat_lines`), read as its log grows."""

    def __init__(self, path: Path, start: float) -> None:
        self.path, self.start, self.offset = path, start, 0
        self.lines: list[SeatLine] = []

    def read(self) -> list[SeatLine]:
        data = appended(self.path, self.offset)
        whole = data[:data.rfind(b"\n") + 1]  # a line still being written is read next time
        self.offset += len(whole)
        new = seat_lines(whole.decode(errors="replace"), self.start, time.time())
        self.lines += new
        return new

    def last(self, *kinds: str) -> SeatLine | None:
        return next((x for x in reversed(self.lines) if x.kind in kinds), None)

    @property
    def holds(self) -> bool:
        last = self.last("holds", "gave_up")
        return last is not None and last.kind == "holds"


@dataclass
class Coordinator:
    name: str  # process and log name
    host: str
    state_dir: Path
    maddrs_file: Path
    proc: Process
    log: SeatLog
    started: float

    def maddrs(self) -> list[str]:
        try:
            return json.loads(self.maddrs_file.read_text())["maddrs"]
        except (OSError, ValueError, KeyError):
            return []


class Coordinators:
    """The run's coordinators, their kills and restarts (the module docstring)."""

    def __init__(self, swarm: LocalSwarm, hosts: ProcessHosts, args: list[str], pids_on: Callable[[str], list[int]],
                 started: float) -> None:
        """`swarm`: its coordinator serves (started at `started`); `args`: more flags for every standby;
        `pids_on(host)`: the processes left on a host."""
        self.swarm, self.hosts, self.args, self.pids_on = swarm, hosts, args, pids_on
        self.key = swarm.dir / "swarm.key"
        first = dict(swarm.procs)["coordinator"]
        self.all = [Coordinator("coordinator", "coordinator", swarm.dir, swarm.dir / "coordinator.json", first,
                                SeatLog(swarm.dir / "coordinator.log", started), started)]
        self.kills: list[CoordinatorKill] = []
        self.skipped: list[dict] = []
        self.killed: set[str] = set()
        self.exited: dict[str, int] = {}  # coordinators that ended by themselves -> exit code

    def start(self, host: str, state_dir: Path, entry: str) -> Coordinator:
        """`swarm coordinator --standby` on `host`, joining through `entry`, from `state_dir`."""
        n = sum(c.host == host for c in self.all)
        name = host if n == 0 else f"{host}-{n + 1}"
        self.hosts.of[name] = host
        maddrs_file = state_dir / f"{name}.maddrs.json"
        maddrs_file.unlink(missing_ok=True)
        state_dir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        proc = self.swarm.spawn(name, ["coordinator", "--standby", "--initial-peers", entry, "--key", str(self.key),
                                       "--state-dir", str(state_dir), "--host-maddrs",
                                       f"/ip4/{self.hosts.host(name)}/tcp/0", "--maddrs-file", str(maddrs_file),
                                       "--id-work-bits", str(self.swarm.opts.id_work_bits), *self.args])
        c = Coordinator(name, host, state_dir, maddrs_file, proc, SeatLog(self.swarm.dir / f"{name}.log", started),
                        started)
        self.all.append(c)
        print(f"{name} starts as a standby coordinator on host {host}", flush=True)
        return c

    def start_standby(self) -> Coordinator:
        return self.start(STANDBY, self.swarm.dir / "standby-state", self.swarm.maddrs[0])

    @property
    def host_names(self) -> list[str]:
        return list(dict.fromkeys(c.host for c in self.all))

    def live(self) -> list[Coordinator]:
        return [c for c in self.all if c.name not in self.killed and c.proc.poll() is None]

    def active(self) -> Coordinator | None:
        """The live coordinator whose log says it holds the seat (the highest term, should two say so)."""
        holding = [c for c in self.live() if c.log.holds]
        return max(holding, key=lambda c: c.log.last("holds").term or 0, default=None)

    def standing_by(self) -> Coordinator | None:
        """A live coordinator that logged "standing by" since its last seat change, and serves its address."""
        return next((c for c in self.live() if not c.log.holds and c.maddrs()
                     and (last := c.log.last("holds", "gave_up", "stands_by")) is not None
                     and last.kind == "stands_by"), None)

    def ready(self) -> bool:
        return self.active() is not None and self.standing_by() is not None

    def kill_active(self) -> CoordinatorKill | None:
        """SIGKILL the active coordinator (its process alone), if another stands by; else None."""
        self.poll()
        active, standby = self.active(), self.standing_by()
        if active is None or standby is None:
            why = "no coordinator holds the seat" if active is None else "no coordinator stands by"
            self.skipped.append({"time": time.time(), "why": why})
            print(f"coordinator kill skipped: {why}", flush=True)
            return None
        t = time.time()
        active.proc.send_signal(signal.SIGKILL)
        active.proc.wait(timeout=10)
        self.killed.add(active.name)
        self.swarm.maddrs = standby.maddrs()  # newcomers join through a live coordinator
        kill = CoordinatorKill(t, active.name, active.host, active.log.last("holds").term, standby.name)
        self.kills.append(kill)
        print(f"killed coordinator {active.name} (term {kill.term}); {standby.name} stands by", flush=True)
        return kill

    def poll(self) -> None:
        """Read the logs; note takeovers, killed coordinators gone from their hosts, exits; restart the killed."""
        for c in self.all:
            c.log.read()
            if c.name not in self.killed and c.name not in self.exited and c.proc.poll() is not None:
                self.exited[c.name] = c.proc.returncode
                print(f"coordinator {c.name} exited by itself with code {c.proc.returncode}", flush=True)
        for kill in self.kills:
            self._follow(kill)

    def _follow(self, kill: CoordinatorKill) -> None:
        now = time.time()
        if kill.takeover is None:
            for c in self.all:
                line = next((x for x in c.log.lines if x.kind == "holds" and x.seen >= kill.time), None)
                if c.name != kill.victim and line is not None:
                    kill.takeover, kill.takeover_clock, kill.holder, kill.new_term = line.seen, line.clock, c.name, \
                        line.term
                    print(f"coordinator {c.name} holds the seat (term {line.term}) {line.seen - kill.time:.1f} s "
                          f"after the kill of {kill.victim}", flush=True)
                    break
        if kill.gone_s is None and not self.pids_on(kill.host):
            kill.gone_s = round(now - kill.time, 2)
        if kill.restarted is None and kill.takeover is not None and (kill.gone_s is not None
                                                                     or now - kill.time > RESTART_AFTER_S):
            if kill.gone_s is None:
                kill.notes.append(f"restarted while processes of {kill.victim} were still on its host")
            victim = next(c for c in self.all if c.name == kill.victim)
            holder = next(c for c in self.all if c.name == kill.holder)
            kill.restarted = self.start(kill.host, victim.state_dir, (holder.maddrs() or self.swarm.maddrs)[0]).name
        if kill.restarted is not None and kill.ready is None:
            again = next(c for c in self.all if c.name == kill.restarted)
            line = again.log.last("stands_by")
            if line is not None:
                kill.ready = line.seen

    def summary(self, records: list[StepRecord], classified: dict, refit_every: int | None, t0: float,
                end: float, restores: list[dict] = ()) -> dict:
        """`coordinator_summary` (times from `t0`), and each coordinator process: its host, when it started and
        was killed, its exit code if it ended by itself."""
        for c in self.all:
            c.log.read()  # the last lines, written as they stopped
        killed = {k.victim: k.time for k in self.kills}
        skipped = [{"at_s": round(s["time"] - t0, 1), "why": s["why"]} for s in self.skipped]
        return {**coordinator_summary(self.kills, skipped, records, {c.name: c.log.lines for c in self.all},
                                      classified, refit_every, t0, end, restores),
                "processes": [{"name": c.name, "host": c.host, "started_at_s": round(c.started - t0, 1),
                               "killed_at_s": round(killed[c.name] - t0, 1) if c.name in killed else None,
                               "exited": self.exited.get(c.name)} for c in self.all]}
