"""`swarm bench churn --coordinator-kills N` (issue 56, item 5): the coordinator kills' figures on synthetic
records (swarm/bench/churn/seat_report.py), which coordinator the bench takes for the active one (its log, not its
name) and how it kills and restarts them (swarm/bench/churn/coordinators.py, with stand-in processes), and the
bench at smoke size with one kill of the active coordinator, in kernel-shaped namespaces."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from pathlib import Path

import pytest

from swarm.bench.churn.coordinators import Coordinators, ProcessHosts
from swarm.bench.churn.report import StepRecord
from swarm.bench.churn.seat_report import CoordinatorKill, SeatLine, coordinator_summary, seat_lines, summary_line
from swarm.cli import main
from tests.netlab import missing_requirements

T0 = 1_800_000_000.0
SEAT = "swarm.coordinator.seat"


def _at(t: float, text: str) -> str:
    return f"{dt.datetime.fromtimestamp(t):%H:%M:%S} INFO {text}"


def test_seat_lines_read_the_seat_and_the_basis_versions_at_their_second():
    text = "\n".join([
        _at(T0 + 1, f"{SEAT}: standing by: coordinator xE3cUy2t holds the seat (term 1, since 00:58:03)"),
        _at(T0 + 20, f"{SEAT}: this coordinator holds the seat: term 2, since 00:58:59"),
        _at(T0 + 30, "swarm.basis.refit: basis version 3 published, effective at step 510"),
        _at(T0 + 40, f"{SEAT}: this coordinator gave up the seat: coordinator abcdefgh holds it (term 3)"),
        "  a traceback line without a time",
    ])
    found = seat_lines(text, T0, seen=T0 + 99)
    assert [(x.kind, x.term, x.version, x.step) for x in found] == [
        ("stands_by", 1, None, None), ("holds", 2, None, None), ("published", None, 3, 510),
        ("gave_up", None, None, None)]
    assert found[1].clock == pytest.approx(T0 + 20.5) and all(x.seen == T0 + 99 for x in found)


def _records(first: int, last: int, start: float, every: float = 1.0) -> list[StepRecord]:
    return [StepRecord(start + i * every, s, "h0", 5.0 - 0.01 * s) for i, s in enumerate(range(first, last + 1))]


def test_each_kill_has_its_failover_its_outage_steps_its_window_and_the_new_holders_basis_versions():
    recs = _records(1, 300, T0)  # a step a second
    kills = [CoordinatorKill(T0 + 100.2, "coordinator", "coordinator", 1, "standby", takeover=T0 + 114.7,
                             takeover_clock=T0 + 114.5, holder="standby", new_term=2, gone_s=4.0,
                             restarted="coordinator-2", ready=T0 + 160.0),
             CoordinatorKill(T0 + 200.2, "standby", "standby", 2, "coordinator-2", takeover=T0 + 212.2,
                             takeover_clock=T0 + 211.5, holder="coordinator-2", new_term=3)]
    lines = {"coordinator": [SeatLine(T0 + 61, T0 + 60.5, "published", version=1, step=60)],
             "standby": [SeatLine(T0 + 114.7, T0 + 114.5, "holds", term=2),
                         SeatLine(T0 + 181, T0 + 180.5, "published", version=2, step=190)],
             "coordinator-2": [SeatLine(T0 + 212.2, T0 + 211.5, "holds", term=3)]}
    classified = {"lost": [150], "doubled": [], "repeated": [250]}
    restores = [{"at_s": 130.5, "peer": "h8", "stage": 0, "from_step": 100}]
    c = coordinator_summary(kills, [], recs, lines, classified, refit_every=60, t0=T0, end=T0 + 299.5,
                            restores=restores)
    first, second = c["kills"]
    assert first["failover_s"] == pytest.approx(14.5) and first["failover_clock_s"] == pytest.approx(14.3)
    assert first["at_s"] == pytest.approx(100.2) and first["holder"] == "standby" and first["new_term"] == 2
    assert first["step_at_kill"] == 101 and first["steps_during_outage"] == 14  # steps 102-115
    assert first["window_steps"] == [102, 201] and first["lost_steps"] == [150] and not first["every_step_once"]
    assert first["refit_steps"] == [120, 180] and first["basis_versions_by_new_holder"] == [2]
    assert first["basis_published"] is True and first["restarted_standing_by_s"] == pytest.approx(59.8)
    assert first["stage_restores"] == restores and second["stage_restores"] == []
    assert second["window_steps"] == [202, 300] and second["repeated_steps"] == [250] and second["every_step_once"]
    assert second["refit_steps"] == [240, 300] and second["basis_published"] is False  # re-fits due, none published
    assert c["failover_s"] == {"min": pytest.approx(12.0), "median": pytest.approx(13.25), "max": pytest.approx(14.5)}
    assert c["steps_during_outage"]["median"] == 13 and c["takeovers"] == 2 and not c["every_step_once"]
    assert c["basis_versions"] == {"coordinator": [1], "standby": [2]} and c["basis_chain_unbroken"] is True
    assert "failover min / median / max 12.0 / 13.2 / 14.5 s" in summary_line(c)
    assert "steps during the outages [14, 12] (median 13)" in summary_line(c)
    assert "stage restores after a kill: 1" in summary_line(c)
    # a version signed twice breaks the chain; a run that does not re-fit has no verdict on the basis
    lines["coordinator-2"].append(SeatLine(T0 + 250, T0 + 250, "published", version=2, step=250))
    assert coordinator_summary(kills, [], recs, lines, classified, 60, T0, T0 + 299.5)["basis_chain_unbroken"] is False
    fixed = coordinator_summary(kills, [], recs, lines, classified, None, T0, T0 + 299.5)
    assert [r["basis_published"] for r in fixed["kills"]] == [None, None]


def test_a_kill_no_standby_took_over_has_no_failover_and_its_outage_runs_to_the_end():
    kill = CoordinatorKill(T0 + 10.2, "coordinator", "coordinator", 1, "standby")
    c = coordinator_summary([kill], [{"at_s": 50.0, "why": "no coordinator stands by"}], _records(1, 40, T0), {},
                            {"lost": [], "doubled": [], "repeated": []}, None, T0, T0 + 39.5)
    assert c["kills"][0]["failover_s"] is None and c["kills"][0]["steps_during_outage"] == 29
    assert c["failover_s"] == {"min": None, "median": None, "max": None} and c["takeovers"] == 0
    assert "failover min / median / max n/a" in summary_line(c) and "(1 skipped)" in summary_line(c)


def test_a_negative_count_of_coordinator_kills_is_refused_before_anything_starts(tmp_path, capsys):
    assert main(["bench", "churn", "--out", str(tmp_path), "--coordinator-kills", "-1"]) == 2
    assert "--coordinator-kills at least 0" in capsys.readouterr().err and not list(tmp_path.iterdir())


class FakeProc:
    """A stand-in coordinator process: alive until killed."""

    def __init__(self) -> None:
        self.returncode = None
        self.signals: list[int] = []

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        self.returncode = -sig

    def wait(self, timeout: float | None = None) -> int | None:
        return self.returncode


class FakeSwarm:
    def __init__(self, folder: Path) -> None:
        self.dir, self.maddrs, self.procs = folder, ["/ip4/10.0.0.2/tcp/1/p2p/first"], [("coordinator", FakeProc())]
        self.spawned: list[tuple[str, list[str]]] = []
        self.opts = type("Opts", (), {"id_work_bits": 0})()

    def spawn(self, name: str, args: list[str]) -> FakeProc:
        self.spawned.append((name, args))
        self.procs.append((name, FakeProc()))
        return self.procs[-1][1]


class Hosts:
    def prefix(self, name: str) -> list[str]:
        return ["in", name]

    def host(self, name: str) -> str:
        return {"coordinator": "10.0.0.2", "standby": "10.0.0.3"}[name]


def _say(swarm: FakeSwarm, name: str, text: str, maddr: str | None = None) -> None:
    with open(swarm.dir / f"{name}.log", "a") as f:
        f.write(_at(time.time(), f"{SEAT}: {text}") + "\n")
    if maddr:
        folder = swarm.dir if name == "coordinator" else swarm.dir / "standby-state"
        (folder / ("coordinator.json" if name == "coordinator" else f"{name}.maddrs.json")).write_text(
            json.dumps({"maddrs": [maddr]}))


def test_the_active_coordinator_is_the_one_whose_log_holds_the_seat_and_a_killed_one_comes_back_as_a_standby(
        tmp_path):
    swarm, left = FakeSwarm(tmp_path), {"coordinator": [7]}
    placement = ProcessHosts(Hosts())
    coords = Coordinators(swarm, placement, ["--checkpoint-dir", "K"], lambda host: left.get(host, []),
                          time.time() - 5)
    standby = coords.start_standby()
    assert swarm.spawned[0] == ("standby", [
        "coordinator", "--standby", "--initial-peers", "/ip4/10.0.0.2/tcp/1/p2p/first", "--key",
        str(tmp_path / "swarm.key"), "--state-dir", str(tmp_path / "standby-state"), "--host-maddrs",
        "/ip4/10.0.0.3/tcp/0", "--maddrs-file", str(tmp_path / "standby-state" / "standby.maddrs.json"),
        "--id-work-bits", "0", "--checkpoint-dir", "K"])
    assert coords.kill_active() is None and coords.skipped[-1]["why"] == "no coordinator holds the seat"
    # the standby's log, not its name, says who holds the seat
    _say(swarm, "standby", "this coordinator holds the seat: term 1, since 00:00:00", "/ip4/10.0.0.3/tcp/2/p2p/s")
    _say(swarm, "coordinator", "standing by: coordinator s holds the seat (term 1, since 00:00:00)",
         "/ip4/10.0.0.2/tcp/1/p2p/first")
    coords.poll()
    assert coords.active() is standby and coords.standing_by().name == "coordinator" and coords.ready()
    kill = coords.kill_active()
    assert kill.victim == "standby" and kill.term == 1 and kill.standby == "coordinator"
    assert standby.proc.signals == [9] and swarm.maddrs == ["/ip4/10.0.0.2/tcp/1/p2p/first"]
    assert coords.active() is None and not coords.ready()
    # the old coordinator takes the seat; the killed one starts again on its host once nothing of it is left there
    _say(swarm, "coordinator", "this coordinator holds the seat: term 2, since 00:00:00")
    left["standby"] = [8]
    coords.poll()
    assert kill.holder == "coordinator" and kill.new_term == 2 and kill.takeover >= kill.time
    assert kill.restarted is None and kill.gone_s is None  # its DHT child is still on its host
    left.pop("standby")
    coords.poll()
    assert kill.gone_s is not None and kill.restarted == "standby-2" and placement.of["standby-2"] == "standby"
    name, args = swarm.spawned[-1]
    assert name == "standby-2" and args[args.index("--initial-peers") + 1] == "/ip4/10.0.0.2/tcp/1/p2p/first"
    assert args[args.index("--state-dir") + 1] == str(tmp_path / "standby-state")  # its identity again
    assert placement.prefix("standby-2") == ["in", "standby"] and placement.host("standby-2") == "10.0.0.3"
    _say(swarm, "standby-2", "standing by: coordinator first holds the seat (term 2, since 00:00:00)",
         "/ip4/10.0.0.3/tcp/3/p2p/s")
    coords.poll()
    assert kill.ready is not None and coords.ready() and coords.host_names == ["coordinator", "standby"]
    rows = coords.summary([], {"lost": [], "doubled": [], "repeated": []}, None, kill.time, kill.time + 60)
    assert [(p["name"], p["host"], p["killed_at_s"]) for p in rows["processes"]] == [
        ("coordinator", "coordinator", None), ("standby", "standby", 0.0), ("standby-2", "standby", None)]


@pytest.mark.e2e  # peers and two coordinators in network namespaces, the active coordinator killed
@pytest.mark.skipif(bool(missing_requirements(nat=False)), reason=str(missing_requirements(nat=False)))
def test_churn_bench_smoke_with_a_coordinator_kill(tmp_path):
    """The churn smoke (4 hosts, 2 stages x 2 replicas, the leading head killed) with a standby coordinator and one
    kill of the active coordinator: a standby takes the seat within 30 s and the JSON and PNG say so."""
    from swarm.bench.churn.bench import run_churn_bench
    run_churn_bench(str(tmp_path), smoke=True, coordinator_kills=1)
    written = json.loads((tmp_path / "churn.json").read_text())
    try:
        assert (tmp_path / "churn.png").stat().st_size > 10_000
        c = written["coordinators"]
        [kill] = c["kills"]
        assert kill["victim"] == "coordinator" and kill["term"] == 1 and kill["holder"] == "standby"
        assert kill["new_term"] == 2 and 0 < kill["failover_s"] <= 30, kill
        assert c["failover_s"]["median"] == kill["failover_s"] and c["skipped"] == []
        assert kill["gone_s"] is not None and kill["gone_s"] < 20  # its DHT child and p2pd went by themselves
        assert kill["restarted"] == "coordinator-2" and kill["steps_during_outage"] >= 0
        assert kill["every_step_once"] and written["summary"]["lost_steps"] == []
        assert written["summary"]["doubled_steps"] == []
        assert written["left_behind"] == {}  # the standbys too, and every namespace gone
        assert written["namespace_tag"] not in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                               text=True).stdout
    except Exception:  # CI keeps no files: the coordinators' last log lines say what they did
        for log in sorted((tmp_path / "churn-run").glob("*.log")):
            print(f"--- {log.name}, last lines:", *log.read_text(errors="replace").splitlines()[-25:], sep="\n")
        raise
