"""The runs behind docs/benchmarks.md "A replica joining over a home link": how long a replica that joins a
`powersgd` stage mid-run takes to be level with the swarm, when its donor forwards each step whole (before
2026-12-01) and as its reduce's sums (after), side by side: the two code versions alternate, round by round.

One run (`run`): `swarm local` processes on this machine, tiny, 2 stages, replica_sync powersgd, every peer's
uplink and downlink shaped by the built-in shaper (4 Mbit/s, 20 ms), one replica per stage; after 10 steps a
second replica of stage 1 starts. Measured from its start: when it had downloaded the state ("joined"), when
the swarm first vouched for its state (its first "state_checked": level, and checked), and the swarm's
tokens/s before it started and from then until it was level (or the run's end).

Usage (CPU):
    python docs/results/follow_join.py run OUT.json                   # one run, with the code on sys.path
    python docs/results/follow_join.py ab OLD_CHECKOUT OUT_DIR [ROUNDS]  # OLD_CHECKOUT against this one, alternated
                                                                       # (runs already in OUT_DIR are kept)
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEPS, JOIN_AFTER, BANDWIDTH, LATENCY = 120, 10, "4mbit", "20ms"


def _events(swarm, name: str, kind: str) -> list[dict]:
    return [e for e in swarm.events(name) if e["event"] == kind]


def one_run(out: str) -> dict:
    from protocol.spec import preset
    from swarm.local import LocalOptions, LocalSwarm
    spec = preset("tiny", stages=2, replica_sync="powersgd", replica_sync_rank=8)  # as measured
    work = tempfile.mkdtemp(prefix="follow-join-")
    swarm = LocalSwarm(LocalOptions(spec, steps=STEPS, workdir=work, threads=1, quiet=True, bandwidth=BANDWIDTH,
                                    latency=LATENCY))
    try:
        swarm.start_coordinator("--snapshot-every", "1000")
        swarm.start_peer(1, name="stage1")
        swarm.start_peer(0, "--steps", str(STEPS), name="stage0")
        deadline = time.monotonic() + 300
        while len(_events(swarm, "stage0", "step")) < JOIN_AFTER:
            assert time.monotonic() < deadline, "the swarm did not train"
            swarm._check_alive()
            time.sleep(0.2)  # poll the head's report
        start = time.time()
        swarm.start_peer(1, name="joiner")
        while not _events(swarm, "joiner", "state_checked") and len(_events(swarm, "stage0", "step")) < STEPS:
            swarm._check_alive()
            time.sleep(0.2)  # poll the joiner's and the head's reports
    finally:
        swarm.stop()
    steps = _events(swarm, "stage0", "step")
    joined, checked = _events(swarm, "joiner", "joined"), _events(swarm, "joiner", "state_checked")
    level = checked[0]["time"] if checked else None
    before = [e for e in steps if e["time"] < start and e["step"] > 1]
    during = [e for e in steps if e["time"] >= start and (level is None or e["time"] <= level)]

    def rate(rows: list[dict]) -> float | None:
        return sum(e["tokens"] for e in rows) / sum(e["seconds"] for e in rows) if rows else None
    result = {"joined_s": joined[0]["time"] - start if joined else None, "joined_step": joined[0]["step"]
              if joined else None, "level_s": level - start if level is not None else None,
              "level_step": checked[0]["step"] if checked else None, "steps_done": len(steps),
              "tokens_per_s_before": rate(before), "tokens_per_s_until_level": rate(during),
              "slowest_step_until_level_s": max((e["seconds"] for e in during), default=None)}
    Path(out).write_text(json.dumps(result, indent=1))
    return result


def ab(old: str, out_dir: str, rounds: int) -> None:
    here = Path(__file__).resolve().parents[2]
    arms = {"whole": Path(old).resolve(), "sums": here}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    for r in range(rounds):
        for arm, root in (arms.items() if r % 2 == 0 else reversed(arms.items())):
            path = out / f"{arm}-{r}.json"
            if not path.exists():  # resumable: a run already written is kept
                env = {**os.environ, "PYTHONPATH": str(root)}
                subprocess.run([sys.executable, str(Path(__file__).resolve()), "run", str(path)], cwd=root, env=env,
                               check=True)
            runs[arm].append(json.loads(path.read_text()))
            print(arm, r, runs[arm][-1], flush=True)

    def median(arm: str, key: str) -> float | None:
        vals = [x[key] for x in runs[arm] if x[key] is not None]
        return statistics.median(vals) if vals else None
    summary = {arm: {"level_s_median": median(arm, "level_s"), "joined_s_median": median(arm, "joined_s"),
                     "level_in": sum(x["level_s"] is not None for x in runs[arm]), "runs": len(runs[arm]),
                     "tokens_per_s_before_median": median(arm, "tokens_per_s_before"),
                     "tokens_per_s_until_level_median": median(arm, "tokens_per_s_until_level")} for arm in arms}
    meta = {"preset": "tiny", "stages": 2, "replica_sync": "powersgd", "bandwidth": BANDWIDTH, "latency": LATENCY,
            "steps": STEPS, "join_after": JOIN_AFTER, "old_checkout": str(arms["whole"])}
    from swarm.bench.common.machine import machine_info
    (out / "follow_join.json").write_text(json.dumps({"settings": meta, "machine": machine_info(["cpu"]),
                                                      "summary": summary, "runs": runs}, indent=1))
    _plot(runs, out / "follow_join.png")
    print(json.dumps(summary, indent=1))


def _plot(runs: dict[str, list[dict]], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, rows in enumerate(runs.values()):
        for x in rows:
            y = x["level_s"] if x["level_s"] is not None else 0.0
            ax.bar(i, y, width=0.6, alpha=0.35, color=f"C{i}")
            if x["level_s"] is None:
                ax.annotate("never level", (i, 0), ha="center", va="bottom")
    ax.set_xticks(range(len(runs)), [f"{arm} ({len(rows)} runs)" for arm, rows in runs.items()])
    ax.set_ylabel("seconds from start to level and checked")
    ax.set_title(f"a replica joining a powersgd stage, tiny, {BANDWIDTH} {LATENCY}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        one_run(sys.argv[2])
    elif sys.argv[1:2] == ["ab"]:
        ab(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else 3)
    else:
        raise SystemExit(__doc__)
