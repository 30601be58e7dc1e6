"""What a local swarm's peers report, read back: each peer's JSON-lines report in the workdir
gives the progress bar (and TensorBoard scalars) while the run goes, and the metrics JSON of
`swarm local --metrics-out` at its end: loss per step, wire bytes per token against a dense
boundary's, tokens/s, replica-sync bytes and each stage's link.
"""
from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from tqdm import tqdm

from swarm.monitor.scalars import ScalarLog
from swarm.net.dense_baseline import dense_bytes_per_token


class LocalSwarmError(RuntimeError):
    """The local swarm could not run; the message says what failed and where its logs are."""


def report_events(path: Path) -> list[dict]:
    """The records of a JSON-lines report another process may be writing: only lines that end in a
    newline, since a reader can see a long record half written (the Reporter appends one line a write)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def mean_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    """The mean of each part over the steps that have it (a step's commit by part, peer/daemon/step_log.py)."""
    keys = sorted({k for p in parts for k in p})
    return {k: sum(p[k] for p in parts if k in p) / sum(1 for p in parts if k in p) for k in keys}


class RunReports:
    """Mixed into `LocalSwarm` (swarm/local.py), whose workdir, options and processes these read."""

    def events(self, stage: int | str) -> list[dict]:
        path = self.dir / (f"stage{stage}.jsonl" if isinstance(stage, int) else f"{stage}.jsonl")
        return report_events(path)

    def step_events(self) -> tuple[list[dict], bool]:
        """Every step record so far, from whichever head drove it, in step order; and whether the
        run is done (a head said so). A step driven again after a rollback to a snapshot
        (peer/state/rollback.py) is the one that stands: of two records of a step, the later counts."""
        by_step, done = {}, False
        for name in self.head_names():
            for e in self.events(name):
                if e["event"] == "step" and (e["step"] not in by_step or e["time"] >= by_step[e["step"]]["time"]):
                    by_step[e["step"]] = e
                done = done or e["event"] == "done"
        steps = [by_step[k] for k in sorted(by_step)]
        return steps, done

    def dump_stacks(self, wait: float = 5.0) -> None:
        """Have every live process write its threads' stacks to its log (SIGUSR1, swarm/cli.py), and wait
        up to `wait` s for them to be there: what a swarm that stopped stepping was doing."""
        logs = {}
        for name, proc in self.procs:
            if proc.poll() is None:
                path = self.dir / f"{name}.log"
                logs[path] = path.stat().st_size if path.exists() else 0
                proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any((p.stat().st_size if p.exists() else 0) <= n
                                                 for p, n in logs.items()):
            time.sleep(0.1)  # poll: each process writes its stacks when its signal handler runs

    def follow(self, timeout_per_step: float = 300.0) -> list[dict]:
        """Feed the progress bar from the heads' reports until one says done; returns the step records."""
        bar = tqdm(total=self.opts.steps, unit="step", disable=self.opts.quiet, dynamic_ncols=True)
        seen, last_progress = 0, time.monotonic()
        scalars = ScalarLog(self.opts.tensorboard) if self.opts.tensorboard else None
        try:
            while True:
                steps, done = self.step_events()
                for rec in steps[seen:]:
                    bar.update(1)
                    bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens'] / max(rec['seconds'], 1e-9):.0f}",
                                    B_tok=f"{rec.get('forward_bytes_per_token', 0):.1f}")
                    if scalars is not None:
                        scalars.write(rec["step"], {"loss": rec["loss"], "tokens_per_s": rec["tokens"] / max(
                            rec["seconds"], 1e-9), "lr": rec.get("lr"), "basis_version": rec["basis_version"]},
                            wall_time=rec.get("time"))
                if len(steps) > seen:
                    seen, last_progress = len(steps), time.monotonic()
                if done:
                    return steps
                try:
                    self._check_alive()
                except LocalSwarmError:
                    if self.step_events()[1]:  # a head wrote "done" and left between the two looks
                        return self.step_events()[0]
                    raise
                if time.monotonic() - last_progress > timeout_per_step:
                    self.dump_stacks()
                    raise LocalSwarmError(f"no step finished in {timeout_per_step:g} s; see the logs in {self.dir} "
                                          f"(each live peer's ends with its threads' stacks).")
                time.sleep(0.2)  # poll interval of the head's report file
        finally:
            bar.close()
            if scalars is not None:
                scalars.close()

    def metrics(self, steps: list[dict]) -> dict:
        names = [self.peer_name(s, r) for s in range(self.opts.spec.n_stages) for r in range(self.opts.replicas)]
        wire = [e for name in names for e in self.events(name) if e["event"] == "wire"]
        fwd = sum(w["bytes_out"]["act"] for w in wire)
        bwd = sum(w["bytes_out"]["grad"] for w in wire)
        ftok = sum(w["tokens_out"]["act"] for w in wire)
        btok = sum(w["tokens_out"]["grad"] for w in wire)
        fdir, bdir = (sum(w.get("direct_out", {}).get(kind, 0) for w in wire) for kind in ("act", "grad"))
        # replica sync: what each replica sent in reduces, per step it took with another replica
        sync = {name: e["bytes_out"].get("red", 0) / e["synced_steps"] for name in names for e in self.events(name)
                if e["event"] == "wire" and e.get("synced_steps")}
        timed = steps[1:] or steps  # the first step includes warm-up (allocations, first connections)
        tps = sum(s["tokens"] for s in timed) / max(1e-9, sum(s["seconds"] for s in timed))
        return {
            "run": {**self.opts.spec.to_dict(), "run_hash": self.opts.spec.run_hash},
            "steps": [{k: s[k] for k in ("step", "loss", "tokens", "seconds", "basis_version")} for s in steps],
            "wire": {"forward_bytes_per_token": fwd / max(1, ftok), "backward_bytes_per_token": bwd / max(1, btok),
                     "dense_forward_bytes_per_token": dense_bytes_per_token(self.opts.spec),
                     "forward_bytes": fwd, "backward_bytes": bwd, "forward_tokens": ftok, "backward_tokens": btok,
                     "forward_direct_messages": fdir, "backward_direct_messages": bdir},
            "tokens_per_second": tps,
            "sync": {"mode": self.opts.spec.replica_sync, "bytes_per_step": sync,
                     "max_bytes_per_step": max(sync.values(), default=0.0),
                     "commit_seconds": sum(s.get("commit_seconds", 0.0) for s in timed) / max(1, len(timed)),
                     "commit_parts": mean_parts([s.get("commit_parts", {}) for s in timed])},
            "link": {"bandwidth": self.opts.bandwidth, "latency": self.opts.latency},
            "peers": self.peer_links(steps),
        }

    def peer_links(self, steps: list[dict]) -> list[dict]:
        """Per peer (stage by stage, each stage's replicas in order): every byte its transport sent and
        received (frames, all kinds), bytes sent per token it processed, its worker thread's busy
        fraction and (when shaped) its link's busy seconds and the uplink's busy fraction, both of the
        training time (the sum of the head's step times)."""
        seconds = sum(s["seconds"] for s in steps)
        out = []
        for stage in range(self.opts.spec.n_stages):
            for replica in range(self.opts.replicas):
                name = self.peer_name(stage, replica)
                wire = [e for e in self.events(name) if e["event"] == "wire"]
                if wire:
                    out.append(self._peer_link(stage, name, wire[-1], seconds))
        return out

    @staticmethod
    def _peer_link(stage: int, name: str, w: dict, seconds: float) -> dict:
        row = {"stage": stage, "name": name, "bytes_sent": w.get("bytes_sent"),
               "bytes_received": w.get("bytes_received"), "tokens": w.get("tokens_done"), "link": w.get("link")}
        if row["bytes_sent"] is not None and row["tokens"]:
            row["bytes_sent_per_token"] = row["bytes_sent"] / row["tokens"]
        if w.get("worker_busy_s") is not None and seconds > 0:
            row["worker_busy_fraction"] = w["worker_busy_s"] / seconds
        if row["link"] and seconds > 0:
            row["uplink_busy_fraction"] = row["link"]["uplink_busy_s"] / seconds
        return row
