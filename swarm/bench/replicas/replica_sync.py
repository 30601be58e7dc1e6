"""`swarm bench replica-sync`: what each replica-sync mode costs and what it gives up.

1. bytes (`sync_bytes.py`): what one replica sends per step with 2 replicas per stage, per stage
   of the `small` and `large` presets, per mode, and the seconds that takes at --bandwidth.
   Exact figures, machine independent.
2. speed: tokens/s of an in-memory swarm of the training preset (`peer/replica/memory_swarm.py`: every
   peer in this process, messages through the real encoders over loopback links), with each
   peer's uplink shaped to --bandwidth (one `LinkShaper` per host: all it sends shares it),
   with 1 replica per stage and with 2 per stage in each mode; and the seconds per step the
   commit (reduce + apply) took. The peers share this machine's compute, so the 2-replica swarm
   does the same compute as the 1-replica one: the ratio of their tokens/s is what the sync
   costs. (On separate hosts each replica also does half of the compute.)
3. loss: held-out loss after --steps steps with 2 replicas per stage, in each mode, on the same
   data and seeds (equal tokens), links unshaped; with --seeds N, N runs per mode (weights and
   data seeds + 0..N-1), compared seed by seed.

Writes replica_sync.json and replica_sync.png into --out.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
from pathlib import Path
from types import SimpleNamespace

from peer.daemon.loopback import LoopbackLink
from peer.data.batches import BatchSource
from peer.data.corpus import load_corpus
from peer.replica.memory_swarm import make_swarm
from protocol.codecs import WirePacker
from protocol.spec import RunSpec, preset
from swarm.bench.common.machine import machine_info, per_peer_threads, torch_threads
from swarm.bench.record.convergence import held_out_loss
from swarm.net import REPLY_OVERHEAD, REQUEST_OVERHEAD, LinkShaper

from .sync_bytes import sync_bytes

# the benchmark's links are slow and its steps long: give every wait room
SLOW = dict(driver_options=dict(min_timeout=300.0, first_timeout=1800.0, ping_period=1.0),
            commit_options=dict(reduce_timeout=1800.0))


def shaped_link(bandwidth: str | None, latency: str = "0") -> type[LoopbackLink]:
    """A loopback link class whose every request waits on its sender's uplink, and every reply
    on its responder's: one shaper per host, shared by everything that host sends."""
    uplinks: dict[str, LinkShaper] = {}

    def uplink(peer: str) -> LinkShaper:
        return uplinks.setdefault(peer, LinkShaper.from_strings(bandwidth, latency))

    class ShapedLink(LoopbackLink):
        async def request(self, peer: str, kind: str, body: bytes, timeout: float | None = None) -> bytes:
            await uplink(self.peer_id).transmit(len(body) + REQUEST_OVERHEAD)
            reply = await super().request(peer, kind, body, timeout)
            await uplink(peer).transmit(len(reply) + REPLY_OVERHEAD)
            return reply

    return ShapedLink


async def _train(spec: RunSpec, replicas: int, steps: int, device: str, data: str | None,
                 link_cls: type[LoopbackLink] = LoopbackLink):
    with torch_threads(per_peer_threads(replicas * spec.n_stages)):  # the peers' workers share this process
        return await _train_peers(spec, replicas, steps, device, data, link_cls)


async def _train_peers(spec: RunSpec, replicas: int, steps: int, device: str, data: str | None,
                       link_cls: type[LoopbackLink]):
    swarm = await make_swarm(spec, [replicas] * spec.n_stages, link_cls, device=device, data=data, **SLOW)
    t0 = time.perf_counter()

    def progress(log) -> None:
        if log.step % 50 == 0:
            print(f"  {spec.replica_sync} x {replicas}: step {log.step}/{steps}, loss {log.loss:.3f} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)

    try:
        logs = await swarm.drive(steps, progress)
    finally:
        await swarm.stop()
    return swarm, logs


def _label(spec: RunSpec) -> str:
    if spec.replica_sync == "exact":
        return "exact"
    warm = f", {spec.replica_sync_warmup} exact steps first" if spec.replica_sync_warmup else ""
    return f"{spec.replica_sync} r={spec.replica_sync_rank}{warm}"


def _speed_row(spec: RunSpec, replicas: int, steps: int, device: str, data: str | None, bandwidth: str | None,
               latency: str) -> dict:
    swarm, logs = asyncio.run(_train(spec, replicas, steps, device, data, shaped_link(bandwidth, latency)))
    timed = logs[1:] or logs  # the first step includes warm-up
    seconds = sum(log.seconds for log in timed)
    sent = [p.commit.sync_bytes / p.commit.synced_steps for p in swarm.peers.values() if p.commit.synced_steps]
    return {"replicas": replicas, "mode": _label(spec) if replicas > 1 else "(alone)", "steps": len(logs),
            "tokens_per_second": sum(log.tokens for log in timed) / seconds,
            "step_seconds": seconds / len(timed),
            "commit_seconds": sum(log.commit_seconds for log in timed) / len(timed),
            "max_sync_bytes_per_step": max(sent, default=0.0), "final_loss": logs[-1].loss}


def _loss_row(spec: RunSpec, steps: int, device: str, data: str | None, eval_batches: int) -> dict:
    t0 = time.perf_counter()
    swarm, logs = asyncio.run(_train(spec, 2, steps, device, data))
    runners = [swarm.stage(s)[0].runner for s in range(spec.n_stages)]
    corpus = load_corpus(data, seq_len=spec.seq_len)
    val = BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed).val_batches(eval_batches)
    loss = held_out_loss(SimpleNamespace(runners=runners, packer=WirePacker.for_spec(spec)), val)
    return {"mode": _label(spec), "seed": spec.seed, "steps": steps, "tokens": sum(log.tokens for log in logs),
            "held_out_loss": loss, "train": [[log.step, log.loss] for log in logs],
            "seconds": time.perf_counter() - t0}


def run_replica_sync_bench(out_dir: str, preset_name: str = "small", steps: int = 300, speed_steps: int = 6,
                           ranks: tuple[int, ...] = (8, 32), bandwidth: str | None = "80mbit", latency: str = "0",
                           device: str = "cpu", data: str | None = None, stages: int | None = None,
                           eval_batches: int = 16, seeds: int = 1, lr: float | None = None,
                           smoke: bool = False, warmups: tuple[int, ...] = (0,)) -> dict:
    """Bytes, speed and loss of "exact" and of "powersgd" at each rank in `ranks`, each after each
    number of exact warm-up steps in `warmups` (`RunSpec.replica_sync_warmup`; loss runs skipped
    with `steps` 0, speed runs with `speed_steps` 0); `lr` overrides the preset's."""
    if smoke:
        preset_name, steps, speed_steps, stages, eval_batches = "tiny", 4, 3, 2, 2
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    byte_rows = []
    for name in ("tiny",) if smoke else ("small", "large"):
        for i, rank in enumerate(ranks):  # the exact rows once; the powersgd ones per rank
            byte_rows += [{**r, "mode": f"powersgd r={rank}" if r["mode"] == "powersgd" else r["mode"]}
                          for r in sync_bytes(preset(name, codec="subspace"), rank) if i == 0 or r["rank"]]
    base = preset(preset_name, stages=stages, codec="subspace", total_steps=steps if not smoke else 0, lr=lr)
    specs = [base] + [base.replace(replica_sync="powersgd", replica_sync_rank=r, replica_sync_warmup=w)
                      for r in ranks for w in warmups]
    speed = []
    if speed_steps:
        speed = [_speed_row(base, 1, speed_steps, device, data, bandwidth, latency)]
        speed += [_speed_row(spec, 2, speed_steps, device, data, bandwidth, latency) for spec in specs]
    for row in speed:
        row["ratio_to_alone"] = row["tokens_per_second"] / speed[0]["tokens_per_second"]
        print(f"speed {row['replicas']} x {row['mode']:>14}: {row['tokens_per_second']:9.0f} tok/s "
              f"({row['ratio_to_alone']:.2f} of alone), commit {row['commit_seconds']:.2f} s/step", flush=True)
    losses = [_loss_row(spec.replace(seed=spec.seed + i, data_seed=spec.data_seed + i), steps, device, data,
                        eval_batches) for i in range(seeds if steps else 0) for spec in specs]
    exact = {r["seed"]: r["held_out_loss"] for r in losses if r["mode"] == "exact"}
    for row in losses:
        row["vs_exact"] = row["held_out_loss"] / exact[row["seed"]] - 1
        print(f"loss {row['mode']:>14} (seed {row['seed']}): held-out {row['held_out_loss']:.4f} "
              f"({100 * row['vs_exact']:+.2f}% vs exact) after {row['tokens']} tokens", flush=True)
    loss_summary = []
    for mode in dict.fromkeys(r["mode"] for r in losses):
        rows = [r for r in losses if r["mode"] == mode]
        gaps = [r["vs_exact"] for r in rows]
        loss_summary.append({"mode": mode, "runs": len(rows),
                             "mean_held_out_loss": sum(r["held_out_loss"] for r in rows) / len(rows),
                             "mean_vs_exact": sum(gaps) / len(gaps), "min_vs_exact": min(gaps),
                             "max_vs_exact": max(gaps)})
    result = {"device": device, "devices": [device], "machine": machine_info([device]), "bandwidth": bandwidth,
              "latency": latency, "ranks": list(ranks),
              "train_spec": base.to_dict(), "bytes": byte_rows, "bytes_summary": _bytes_summary(byte_rows, bandwidth),
              "speed": speed, "loss": losses, "loss_summary": loss_summary}
    (out / "replica_sync.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "replica_sync.png")
    return result


def _bytes_summary(rows: list[dict], bandwidth: str | None) -> list[dict]:
    """Per preset and mode: the busiest stage's bytes per replica per step, and its seconds at `bandwidth`."""
    from swarm.net import parse_bandwidth
    bps = parse_bandwidth(bandwidth) if bandwidth else None
    out = []
    for name in dict.fromkeys(r["preset"] for r in rows):
        for mode in dict.fromkeys(r["mode"] for r in rows):
            b = max(r["bytes_per_step"] for r in rows if r["preset"] == name and r["mode"] == mode)
            out.append({"preset": name, "mode": mode, "bytes_per_step": b,
                        "seconds_per_step": b * 8 / bps if bps else None})
    for row in out:
        full = next(r["bytes_per_step"] for r in out if r["preset"] == row["preset"] and r["mode"] == "exact, full")
        row["smaller_than_full"] = full / row["bytes_per_step"]
    return out


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    summary = result["bytes_summary"]
    names = list(dict.fromkeys(r["preset"] for r in summary))
    modes = list(dict.fromkeys(r["mode"] for r in summary))
    width = 0.8 / len(modes)
    for i, mode in enumerate(modes):
        ys = [next(r["bytes_per_step"] for r in summary if r["preset"] == n and r["mode"] == mode) for n in names]
        a.bar([j + i * width for j in range(len(names))], ys, width, label=mode)
    a.set_xticks([j + width * (len(modes) - 1) / 2 for j in range(len(names))], names)
    a.set_yscale("log")
    a.set_ylabel("bytes per replica per step (busiest stage)")
    a.set_title("2 replicas per stage")
    a.legend(fontsize=8)
    speed = result["speed"]
    labels = [f"{r['replicas']} x {r['mode']}".replace(" r=", "\nr=") for r in speed]  # the ticks must not overlap
    b.bar(labels, [r["tokens_per_second"] for r in speed])
    b.set_ylabel("tokens / s")
    b.set_title(f"{result['train_spec']['name']} on {result['device']}, {result['bandwidth']} per host", fontsize=9)
    gaps = {r["mode"]: r["mean_vs_exact"] for r in result["loss_summary"]}
    first = result["loss"][0]["seed"] if result["loss"] else None
    for row in (r for r in result["loss"] if r["seed"] == first):  # one seed's curves; the gaps are over all
        xs, ys = zip(*row["train"])
        k = max(1, len(ys) // 100)
        smooth = [sum(ys[i:i + k]) / len(ys[i:i + k]) for i in range(0, len(ys), k)]
        gap = gaps[row["mode"]]
        c.plot(xs[::k][:len(smooth)], smooth, label=f"{row['mode']}: held-out {100 * gap:+.1f}% vs exact"
               if math.isfinite(gap) else row["mode"])
    c.set_xlabel("step")
    c.set_ylabel("training loss (binned)")
    c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

