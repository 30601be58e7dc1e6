"""The churn bench's figures, from what its peers wrote (`swarm bench churn`; swarm/bench/churn/bench.py
runs the swarm and collects the records). Everything here is a pure function of records.

Inputs: every "step" event of every head's report (`StepRecord`: when it was written, the step,
which head wrote it); the kills; the reset and rollback lines of the peers' logs (`log_events`);
the hashes of every checkpoint the peers wrote (`StateHash`, `field_hashes`); each peer's stage spans.

Definitions (over the step records in the order they were written):

- A record is **superseded** when the swarm rolled back past it: a rollback to step T (the
  leading head's "every stage rolls back to step T" line) makes every standing record of a step
  > T superseded, and the steps T+1.. are then **re-driven**, not doubled. A rollback is matched
  to the first record after it that goes back to a step the swarm had already recorded; a
  rollback no record followed (the run ended first) supersedes the records it was ordered over.
- The records that are not superseded **stand**. A step with two standing records whose losses
  differ (relative difference > `SAME_LOSS`) is **doubled**: the second drive ran on weights
  the first had already changed (two heads each drove it, or the swarm went back without a
  rollback). Standing records of one step with the same loss were driven on the same weights
  (a leading head wrote its record and died before every replica applied the step, and the
  next one drove it again): the step counts once, as **repeated**. A step between 1 and the
  highest standing step with no standing record is **lost**; a step applied by every replica
  whose leading head died before writing its record counts as lost too: the reports are the
  only account of it.
- A rollback **costs** the steps between its target and the highest step recorded before it.
- A **stage reset** is a peer's "the stage starts again from its initial weights" line; a **stage restore** a peer's
  "stage S had no live replica: restored from its snapshot at step T" (the swarm rolls back only if the leading
  head orders it: a replica that restored while a live one was there is found behind and downloads again).
- **Goodput**: net progress per minute, (the step of the latest record at the phase's end -
  that at its start) / minutes, for the calm phase (from its first record) and the churn phase;
  their ratio is the figure. Re-driven steps and a rollback's lost ground come off it.
- **Longest gap**: the longest time between consecutive step records (any head) in the churn
  phase, the end of the phase counting as a record (a swarm stalled at the end has a gap).
- **Failover**: for a kill of the leading head (the head that wrote the latest record), the
  seconds from the SIGKILL to the next record written by another head.
- **Replica agreement**: checkpoints of the same stage at the same step, written by different
  peers, compared field by field (`field_hashes`: every tensor's bytes). Replicas are
  **bit-identical** when weights ("module") and optimizer state agree in every such group; the
  other fields (basis, re-fit statistic, ...) that differ are counted apart.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

RESET_TEXT = "the stage starts again from its initial weights"
_RESET = re.compile(r"stage (\d+) had no live replica.*at the swarm's step (\d+)")
# the leading head's order (peer/state/rollback.py); a restored replica's "so every stage rolls back to step T and the
# steps after it are driven again" only foresees one: the swarm may go on without it (a live replica was there)
_ORDER = re.compile(r"every stage rolls back to step (\d+) and steps (\d+)-(\d+)")
_RESTORED = re.compile(r"stage (\d+) had no live replica: restored from (?:its snapshot at step (\d+))?")
_ROLLED = re.compile(r"stage (\d+): rolled back to step (\d+)")  # each replica that did
_CLOCK = re.compile(r"^(\d\d):(\d\d):(\d\d) ")  # swarm/cli.py's log format: local time, whole seconds


@dataclass
class StepRecord:
    time: float  # epoch seconds the head wrote it
    step: int
    head: str  # the peer (process) name
    loss: float
    attempts: int = 1


@dataclass
class Kill:
    time: float
    victim: str
    stage: int | None  # the stage it served (None: it had not finished joining)
    leader: bool  # it wrote the latest step record: the leading head
    targeted: bool  # a leader-every kill (the leading head on purpose)
    newcomer: str  # the fresh peer started on a fresh host in its place
    gone_s: float | None = None  # from the SIGKILL until nothing of its process group was left


@dataclass
class LogEvent:
    time: float
    peer: str
    kind: str  # "reset", "restore" (a replica restored the stage), "rollback" (the leading head's order) or
    # "rolled_back" (one replica)
    stage: int | None = None
    step: int | None = None  # reset: the swarm's step; rollbacks: the target step
    until: int | None = None  # rollback: the last step driven again


WEIGHT_FIELDS = ("module", "optimizer")  # what "bit-identical replicas" means
# the same step on the same weights: microbatches summed in another order (replicas share them
# out differently) move the fp32 loss by ~1e-7; one optimizer step moves it far more than this
SAME_LOSS = 1e-5


@dataclass
class StateHash:
    peer: str
    stage: int
    step: int
    fields: dict[str, str]  # top-level key of the checkpoint -> state_hash of its value


@dataclass
class Span:
    peer: str
    stage: int
    start: float
    end: float


def state_hash(state: object) -> str:
    """sha256 of a checkpoint's content, independent of how torch.save laid it out: dict keys in
    sorted order, every tensor as dtype, shape and raw bytes, anything else as its repr."""
    h = hashlib.sha256()

    def feed(x: object) -> None:
        if isinstance(x, dict):
            for k in sorted(x, key=str):
                h.update(f"<{k}>".encode())
                feed(x[k])
        elif isinstance(x, (list, tuple)):
            h.update(b"[")
            for item in x:
                feed(item)
            h.update(b"]")
        elif isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(x).encode())

    feed(state)
    return h.hexdigest()


def field_hashes(state: dict) -> dict[str, str]:
    """`state_hash` of each top-level field of a checkpoint (module, optimizer, stat, U, ...)."""
    return {str(k): state_hash(v) for k, v in state.items()}


def log_events(peer: str, text: str, start: float) -> list[LogEvent]:
    """Resets and rollbacks in one peer's log. Its lines carry the local time in whole seconds;
    `start` (epoch, before the peer started) fixes the date, and each time is the second's middle."""
    found = []
    for line in text.splitlines():
        clock = _CLOCK.match(line)
        if clock is None:
            continue
        when = _epoch(*(int(g) for g in clock.groups()), start)
        if RESET_TEXT in line:
            m = _RESET.search(line)
            found.append(LogEvent(when, peer, "reset", *((int(m[1]), int(m[2])) if m else (None, None))))
        elif m := _ORDER.search(line):
            found.append(LogEvent(when, peer, "rollback", None, int(m[1]), int(m[3])))
        elif m := _RESTORED.search(line):
            found.append(LogEvent(when, peer, "restore", int(m[1]), int(m[2] or 0)))
        elif m := _ROLLED.search(line):
            found.append(LogEvent(when, peer, "rolled_back", int(m[1]), int(m[2])))
    return found


def _epoch(h: int, m: int, s: int, start: float) -> float:
    day = dt.datetime.fromtimestamp(start).replace(hour=h, minute=m, second=s, microsecond=0)
    for shift in (-1, 0, 1, 2):  # the first such second at or after the run's start (a run may pass midnight)
        t = (day + dt.timedelta(days=shift)).timestamp()
        if t >= start - 2:
            return t + 0.5
    return day.timestamp() + 0.5


def rollbacks(events: list[LogEvent], window: float = 60.0) -> list[LogEvent]:
    """One event per rollback: the leading head's order; where its log lacks one (it may have died
    with it), replicas' "rolled back to step T" lines within `window` s of each other count as one."""
    orders = sorted((e for e in events if e.kind == "rollback"), key=lambda e: e.time)
    out = list(orders)
    for e in sorted((e for e in events if e.kind == "rolled_back"), key=lambda e: e.time):
        if not any(o.step == e.step and abs(o.time - e.time) <= window for o in out):
            out.append(LogEvent(e.time, e.peer, "rollback", None, e.step))
    return sorted(out, key=lambda e: e.time)


def classify(records: list[StepRecord], orders: list[LogEvent]) -> dict:
    """Standing and superseded records, and what each rollback cost (the module's definitions)."""
    recs = sorted(records, key=lambda r: r.time)
    standing: dict[int, list[StepRecord]] = {}
    superseded: list[StepRecord] = []
    used = [False] * len(orders)
    costs: list[int] = [0] * len(orders)
    frontier = 0

    def roll_back(i: int, upto: float) -> None:
        nonlocal frontier
        used[i] = True
        target = orders[i].step
        costs[i] = max(0, frontier - target)
        for s in [s for s in standing if s > target]:
            keep = [r for r in standing[s] if r.time > upto]
            superseded.extend(r for r in standing[s] if r.time <= upto)
            if keep:
                standing[s] = keep
            else:
                del standing[s]
        frontier = max(standing, default=0)

    for r in recs:
        if r.step <= frontier:
            since = max((x.time for x in standing.get(r.step, [])), default=float("-inf"))
            found = [i for i, o in enumerate(orders) if not used[i] and o.step < r.step and since - 1 <= o.time
                     <= r.time + 1]
            if found:
                roll_back(found[-1], r.time)
        standing.setdefault(r.step, []).append(r)
        frontier = max(frontier, r.step)
    for i, o in enumerate(orders):  # ordered, and no record went back after it: the run ended first
        if not used[i] and o.step < frontier:
            roll_back(i, o.time + 1)
    top = max(standing, default=0)
    return {"standing": standing, "superseded": superseded, "costs": costs,
            "lost": [s for s in range(1, top + 1) if s not in standing],
            "doubled": sorted(s for s, rs in standing.items() if len(rs) > 1 and not _same_loss(rs)),
            "repeated": sorted(s for s, rs in standing.items() if len(rs) > 1 and _same_loss(rs))}


def _same_loss(recs: list[StepRecord]) -> bool:
    lo, hi = min(r.loss for r in recs), max(r.loss for r in recs)
    return hi - lo <= SAME_LOSS * max(abs(hi), 1e-12)


def _step_at(recs: list[StepRecord], t: float) -> int:
    before = [r for r in recs if r.time <= t]
    return before[-1].step if before else 0


def _rate(recs: list[StepRecord], a: float, b: float) -> float | None:
    inside = [r for r in recs if a <= r.time <= b]
    if not inside or b <= a:
        return None
    start = a if _step_at(recs, a) else inside[0].time  # the calm phase counts from its first step
    return (_step_at(recs, b) - _step_at(recs, start)) / max((b - start) / 60, 1e-9)


def _longest_gap(recs: list[StepRecord], a: float, b: float) -> tuple[float, float]:
    """(seconds, start) of the longest time between records whose gap ends in [a, b]."""
    times = [r.time for r in recs]
    points = [max([t for t in times if t < a], default=a)] + [t for t in times if a <= t <= b] + [b]
    gaps = [(t1 - t0, t0) for t0, t1 in zip(points, points[1:])]
    return max(gaps) if gaps else (0.0, a)


def coverage(spans: list[Span], stages: int, a: float, b: float) -> dict:
    """Seconds of [a, b] during which the least-served stage had 0, 1, 2, ... live replicas."""
    edges = sorted({a, b, *(t for s in spans for t in (s.start, s.end) if a < t < b)})
    seconds: dict[int, float] = {}
    for t0, t1 in zip(edges, edges[1:]):
        mid = (t0 + t1) / 2
        least = min(sum(1 for s in spans if s.stage == st and s.start <= mid < s.end) for st in range(stages))
        seconds[least] = seconds.get(least, 0.0) + t1 - t0
    return {str(k): round(v, 1) for k, v in sorted(seconds.items()) if round(v, 1) > 0}


def agreement(hashes: list[StateHash], shown: int = 20) -> dict:
    """Same stage, same step, different peers (each peer's last checkpoint of that step counts):
    how many such groups; the first `shown` whose weights or optimizer state differ, with the
    peers' hashes; and per other field, in how many groups it differs."""
    groups: dict[tuple[int, int], dict[str, dict[str, str]]] = {}
    for h in hashes:
        groups.setdefault((h.stage, h.step), {})[h.peer] = h.fields
    compared = {k: v for k, v in sorted(groups.items()) if len(v) >= 2}
    differing, others = [], {}
    for (stage, step), peers in compared.items():
        fields = sorted({f for p in peers.values() for f in p})
        odd = [f for f in fields if len({p.get(f) for p in peers.values()}) > 1]
        for f in odd:
            if f not in WEIGHT_FIELDS:
                others[f] = others.get(f, 0) + 1
        if any(f in WEIGHT_FIELDS for f in odd):
            differing.append({"stage": stage, "step": step, "fields": odd,
                              "hashes": {peer: {f: p.get(f, "")[:16] for f in odd} for peer, p in peers.items()}})
    return {"groups_compared": len(compared), "pairs_compared": sum(len(v) * (len(v) - 1) // 2
                                                                     for v in compared.values()),
            "bit_identical": bool(compared) and not differing, "groups_differing": len(differing),
            "differing": differing[:shown], "other_fields_differing": others}


def analyse(records: list[StepRecord], kills: list[Kill], events: list[LogEvent], hashes: list[StateHash],
            spans: list[Span], stages: int, calm: tuple[float, float], churn: tuple[float, float]) -> dict:
    """The churn bench's summary (the module's definitions); times in seconds, relative to calm[0]."""
    recs = sorted(records, key=lambda r: r.time)
    orders = rollbacks(events)
    c = classify(recs, orders)
    calm_rate, churn_rate = _rate(recs, *calm), _rate(recs, *churn)
    gap, gap_at = _longest_gap(recs, *churn)
    kill_rows = []
    for k in kills:
        after = [r for r in recs if r.time > k.time]
        other = next((r for r in after if r.head != k.victim), None)
        kill_rows.append({"at_s": round(k.time - calm[0], 2), "victim": k.victim, "stage": k.stage, "leader": k.leader,
                          "targeted": k.targeted, "newcomer": k.newcomer, "gone_s": k.gone_s,
                          "next_step_s": round(after[0].time - k.time, 2) if after else None,
                          "failover_s": round(other.time - k.time, 2) if k.leader and other else None})
    failovers = [row["failover_s"] for row in kill_rows if row["failover_s"] is not None]
    resets = [e for e in events if e.kind == "reset"]
    return {
        "goodput": {"calm_steps_per_min": calm_rate, "churn_steps_per_min": churn_rate,
                    "ratio": churn_rate / calm_rate if calm_rate and churn_rate is not None else None},
        "longest_gap_s": round(gap, 2), "longest_gap_at_s": round(gap_at - calm[0], 2),
        "steps": max(c["standing"], default=0), "records": len(recs),
        "lost_steps": c["lost"], "doubled_steps": c["doubled"], "repeated_steps": c["repeated"],
        "redriven_records": len(c["superseded"]),
        "stage_resets": [{"at_s": round(e.time - calm[0], 1), "peer": e.peer, "stage": e.stage, "step": e.step}
                         for e in resets],
        "rollbacks": [{"at_s": round(o.time - calm[0], 1), "to_step": o.step, "steps_lost": cost}
                      for o, cost in zip(orders, c["costs"])],
        "rollback_steps": sum(c["costs"]),
        "stage_restores": [{"at_s": round(e.time - calm[0], 1), "peer": e.peer, "stage": e.stage, "from_step": e.step}
                           for e in events if e.kind == "restore"],
        "replica_agreement": agreement(hashes),
        "failover_s": failovers, "failover_median_s": statistics.median(failovers) if failovers else None,
        "kills": kill_rows, "leader_kills": sum(1 for k in kills if k.leader),
        "children_gone_max_s": max((k.gone_s for k in kills if k.gone_s is not None), default=None),
        "least_replicas_seconds": coverage(spans, stages, *churn),
    }


def plot(result: dict, path, marks: Callable[[tuple, dict], None] | None = None) -> None:
    """Step and loss against minutes, one colour per head (superseded records grey); kills as
    vertical lines (the leading head's red), stage resets, restores and rollbacks marked; churn shaded;
    `marks(axes, result)` draws more (the coordinator kills: seat_report.mark_kills)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = result["summary"]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True, height_ratios=(2, 1))
    rows = result["records"]
    heads = list(dict.fromkeys(r[3] for r in rows))  # one colour per head: who led when
    colours = [f"C{heads.index(r[3]) % 10}" if r[5] else "0.6" for r in rows]
    for ax, col, label in ((top, 1, "step"), (bottom, 2, "loss")):
        if rows:
            ax.scatter([r[0] / 60 for r in rows], [r[col] for r in rows], s=4, c=colours)
        ax.set_ylabel(label)
        ax.axvspan(result["calm_s"] / 60, (result["calm_s"] + result["churn_s"]) / 60, color="0.95", zorder=0)
        for k in s["kills"]:
            ax.axvline(k["at_s"] / 60, color="tab:red" if k["leader"] else "0.5", lw=1 if k["leader"] else 0.7,
                       ls="-" if k["leader"] else "--")
        for r in s["stage_resets"]:
            ax.axvline(r["at_s"] / 60, color="tab:orange", lw=2)
        for r in s["rollbacks"]:
            ax.axvline(r["at_s"] / 60, color="tab:purple", lw=2, ls=":")
        for r in s.get("stage_restores", []):
            ax.axvline(r["at_s"] / 60, color="tab:olive", lw=1.5, ls=":")
    if any(not r[5] for r in rows):
        top.scatter([], [], s=4, color="0.6", label="re-driven (superseded)")
    top.plot([], [], color="tab:red", label="leading head killed")
    top.plot([], [], color="0.5", ls="--", label="peer killed")
    if s["stage_resets"]:
        top.plot([], [], color="tab:orange", lw=2, label="stage reset")
    if s["rollbacks"]:
        top.plot([], [], color="tab:purple", lw=2, ls=":", label="rollback")
    if s.get("stage_restores"):
        top.plot([], [], color="tab:olive", lw=1.5, ls=":", label="a replica restored its stage from a snapshot")
    top.legend(fontsize=8, loc="upper left")
    bottom.set_xlabel("minutes (churn phase shaded; one colour per head that wrote the step)")
    g = s["goodput"]
    ratio = f"{g['ratio']:.2f}" if g["ratio"] is not None else "n/a"
    fo = f"{s['failover_median_s']:.1f} s" if s["failover_median_s"] is not None else "n/a"
    top.set_title(f"{result['preset']}, {result['hosts']} hosts at {result['bandwidth']}, a kill every "
                  f"{result['period_s']:g} s: goodput {ratio} of no churn, longest gap {s['longest_gap_s']:.1f} s, "
                  f"median failover {fo}, {len(s['stage_resets'])} resets", fontsize=9)
    if marks is not None:
        marks((top, bottom), result)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
