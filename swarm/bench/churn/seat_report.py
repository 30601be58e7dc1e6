"""The churn bench's coordinator figures (`swarm bench churn --coordinator-kills N`): what each kill of the active
coordinator cost, as pure functions of the records (swarm/bench/churn/coordinators.py kills and collects them).

Inputs: each coordinator's seat and basis lines (`SeatLine`, parsed from its log by `seat_lines`), each kill
(`CoordinatorKill`), the step records and the steps `report.classify` found lost, doubled or repeated.

Definitions, per kill (times in seconds from the SIGKILL):

- **failover** = t(the bench first reads "this coordinator holds the seat" in another coordinator's log) - t(kill).
  The bench reads the logs every `POLL_S`, so the figure is at most that late; the line's own clock (whole
  seconds; the second's middle is taken) gives `failover_clock_s` beside it. The line is written once the new
  holder's claim won the seat (its claim published, `SETTLE_S` waited, read back as the holder): from then it
  signs. Bound by design (swarm/coordinator/seat.py): SEAT_TTL_S + POLL_S + SETTLE_S after the holder's death.
- **outage**: (kill, failover]; `steps_during_outage` = distinct steps recorded in it (training does not wait for
  a coordinator: the heads follow the newest lease they read).
- **window**: from the kill to the next coordinator kill (the end of the run for the last); its steps are
  (step recorded last before the kill, highest step recorded in the window]. `every_step_once`: no step of the
  window lost or doubled (repeated steps, driven again on the same weights, count once).
- **stage restores** in the window: a peer's "stage S had no live replica: restored from its snapshot" (report.py);
  a joiner whose donor offered the state of a step no record vouches for (one trained during the outage: no
  coordinator vouched for it) restores so, although a live replica is there.
- **basis**: the re-fit steps in the window (multiples of the spec's `basis_interval`, for a run that re-fits)
  and the versions the new holder published in the window after it took the seat; `basis_published` is None
  when no re-fit step fell in the window, else whether it published one.

Over the run: min, median and max of the failovers and of the steps during the outages, and whether the basis
versions all coordinators published are 1..V, each once (`basis_chain_unbroken`: no version signed twice).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from .report import _CLOCK, StepRecord, _epoch

POLL_S = 0.5  # how often the bench reads the coordinators' logs (swarm/bench/churn/bench.py's POLL_S)
_HOLDS = re.compile(r"this coordinator holds the seat: term (\d+)")
_STANDS = re.compile(r"standing by: coordinator (\S+) holds the seat \(term (\d+)")
_GAVE_UP = re.compile(r"this coordinator gave up the seat")
_PUBLISHED = re.compile(r"basis version (\d+) published, effective at step (\d+)")
SOURCE = ("failover_s: from the SIGKILL to the bench's first read of the new holder's log line 'this coordinator "
          f"holds the seat' (the logs are read every {POLL_S:g} s: at most that late); failover_clock_s: the same "
          "line's own clock (whole seconds, the second's middle)")


@dataclass
class SeatLine:
    seen: float  # epoch when the bench first read it
    clock: float  # the line's own time (epoch, the middle of its whole second)
    kind: str  # "holds", "stands_by", "gave_up" or "published"
    term: int | None = None  # holds, stands_by: the seat's term
    version: int | None = None  # published: the basis version ...
    step: int | None = None  # ... and the step it takes effect at


@dataclass
class CoordinatorKill:
    time: float  # epoch of the SIGKILL
    victim: str  # the coordinator process killed (the seat's holder, as its log said)
    host: str  # its host (network namespace)
    term: int | None  # the seat's term it held
    standby: str  # the coordinator that stood by at the kill
    takeover: float | None = None  # epoch: the bench first read another coordinator's "holds the seat" line
    takeover_clock: float | None = None  # that line's own clock
    holder: str | None = None  # the coordinator whose line it was
    new_term: int | None = None
    gone_s: float | None = None  # from the SIGKILL until nothing of it was left on its host
    restarted: str | None = None  # the standby started in its place, on its host, from its state folder
    ready: float | None = None  # epoch: that standby's "standing by" line was read
    notes: list[str] = field(default_factory=list)


def seat_lines(text: str, start: float, seen: float) -> list[SeatLine]:
    """The seat and basis lines of a coordinator's log text, each stamped `seen` (when the bench read it);
    `start` (epoch, before the process started) fixes the date of the lines' clock."""
    found = []
    for line in text.splitlines():
        clock = _CLOCK.match(line)
        if clock is None:
            continue
        when = _epoch(*(int(g) for g in clock.groups()), start)
        if m := _HOLDS.search(line):
            found.append(SeatLine(seen, when, "holds", term=int(m[1])))
        elif m := _STANDS.search(line):
            found.append(SeatLine(seen, when, "stands_by", term=int(m[2])))
        elif _GAVE_UP.search(line):
            found.append(SeatLine(seen, when, "gave_up"))
        elif m := _PUBLISHED.search(line):
            found.append(SeatLine(seen, when, "published", version=int(m[1]), step=int(m[2])))
    return found


def _spread(values: list[float]) -> dict:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _last_step_before(recs: list[StepRecord], t: float) -> int:
    return max((r.step for r in recs if r.time <= t), default=0)


def kill_row(k: CoordinatorKill, until: float, recs: list[StepRecord], lines: dict[str, list[SeatLine]],
             lost: set[int], doubled: set[int], repeated: set[int], refit_every: int | None, t0: float,
             restores: list[dict]) -> dict:
    """One kill's figures (the module's definitions); `until`: the window's end; `t0`: the run's time zero."""
    outage_end = k.takeover if k.takeover is not None else until
    outage = {r.step for r in recs if k.time < r.time <= outage_end}
    first = _last_step_before(recs, k.time)
    last = max((r.step for r in recs if k.time < r.time <= until), default=first)
    window = set(range(first + 1, last + 1))
    refit_steps = [s for s in sorted(window) if s % refit_every == 0] if refit_every else []
    versions = [x.version for x in lines.get(k.holder or "", []) if x.kind == "published"
                and k.time - 1 <= x.clock <= until + 1]  # whole seconds: a second's slack either side

    def rel(t: float | None) -> float | None:
        return round(t - k.time, 2) if t is not None else None
    return {"at_s": round(k.time - t0, 2), "victim": k.victim, "host": k.host, "term": k.term, "standby": k.standby,
            "holder": k.holder, "new_term": k.new_term, "failover_s": rel(k.takeover),
            "failover_clock_s": rel(k.takeover_clock), "gone_s": k.gone_s, "restarted": k.restarted,
            "restarted_standing_by_s": rel(k.ready), "step_at_kill": first,
            "steps_during_outage": len(outage), "window_steps": [first + 1, last] if last > first else [],
            "lost_steps": sorted(window & lost), "doubled_steps": sorted(window & doubled),
            "repeated_steps": sorted(window & repeated), "every_step_once": not (window & (lost | doubled)),
            "refit_steps": refit_steps, "basis_versions_by_new_holder": versions,
            "basis_published": (bool(versions) if refit_steps else None),
            "stage_restores": [r for r in restores if k.time - t0 <= r["at_s"] <= until - t0], "notes": k.notes}


def coordinator_summary(kills: list[CoordinatorKill], skipped: list[dict], records: list[StepRecord],
                        lines: dict[str, list[SeatLine]], classified: dict, refit_every: int | None,
                        t0: float, end: float, restores: list[dict] = ()) -> dict:
    """The coordinator kills' figures: a row per kill, their spread, the basis chain (the module's definitions).
    `classified`: `report.classify`'s result; `refit_every`: the basis interval of a run that re-fits, else None;
    `restores`: `report.analyse`'s stage_restores (times from `t0`)."""
    recs = sorted(records, key=lambda r: r.time)
    lost, doubled, repeated = set(classified["lost"]), set(classified["doubled"]), set(classified["repeated"])
    ends = [k.time for k in kills[1:]] + [end]
    rows = [kill_row(k, until, recs, lines, lost, doubled, repeated, refit_every, t0, list(restores))
            for k, until in zip(kills, ends)]
    published = {name: [x.version for x in found if x.kind == "published"] for name, found in lines.items()}
    every = sorted(v for vs in published.values() for v in vs)
    return {"source": SOURCE, "kills": rows, "skipped": skipped,
            "failover_s": _spread([r["failover_s"] for r in rows if r["failover_s"] is not None]),
            "steps_during_outage": _spread([r["steps_during_outage"] for r in rows if r["failover_s"] is not None]),
            "takeovers": sum(r["failover_s"] is not None for r in rows),
            "every_step_once": all(r["every_step_once"] for r in rows),
            "basis_versions": {n: vs for n, vs in published.items() if vs},
            "basis_chain_unbroken": every == list(range(1, len(every) + 1)) if every else None}


def summary_line(c: dict) -> str:
    """The coordinator kills in one printed line."""
    f, o = c["failover_s"], c["steps_during_outage"]
    fo = f"{f['min']:.1f} / {f['median']:.1f} / {f['max']:.1f} s" if f["median"] is not None else "n/a"
    outages = [r["steps_during_outage"] for r in c["kills"]]
    median = f" (median {o['median']:g})" if o["median"] is not None else ""
    refits = [r["basis_published"] for r in c["kills"] if r["basis_published"] is not None]
    restores = sum(len(r["stage_restores"]) for r in c["kills"])
    return (f"coordinator kills: {len(c['kills'])} ({len(c['skipped'])} skipped), {c['takeovers']} taken over by a "
            f"standby; failover min / median / max {fo} (from the new holder's log); steps during the outages "
            f"{outages}{median}; every step once: {c['every_step_once']}; stage restores after a kill: {restores}; "
            f"a new holder published a basis version after a re-fit step: {sum(refits)} of {len(refits)}; basis "
            f"chain unbroken: {c['basis_chain_unbroken']}")


def mark_kills(axes, result: dict) -> None:
    """On each of `axes` (minutes on x): a coordinator kill as a black dash-dot line, the outage until the new
    holder's claim shaded; the top one's legend and title name them."""
    c = result.get("coordinators")
    if not c or not c["kills"]:
        return
    for ax in axes:
        for r in c["kills"]:
            ax.axvline(r["at_s"] / 60, color="black", lw=1.2, ls="-.")
            if r["failover_s"] is not None:
                ax.axvspan(r["at_s"] / 60, (r["at_s"] + r["failover_s"]) / 60, color="tab:cyan", alpha=0.2, lw=0,
                           zorder=0)
    top = axes[0]
    top.plot([], [], color="black", ls="-.", label="active coordinator killed (shaded: until a standby holds the seat)")
    top.legend(fontsize=8, loc="upper left")
    f = c["failover_s"]
    if f["median"] is not None:
        top.set_title(f"{top.get_title()}\nactive coordinator killed {len(c['kills'])}x: failover {f['min']:.1f} / "
                      f"{f['median']:.1f} / {f['max']:.1f} s (min / median / max), steps during the outages "
                      f"{[r['steps_during_outage'] for r in c['kills']]}", fontsize=9)
