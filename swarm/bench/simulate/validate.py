"""`swarm bench simulate --validate`: the simulator against the real swarm on this machine.

For each case (preset tiny on the CPU, stages x replicas, codec, shaped link), side by side:

1. calibration: this CPU's seconds per microbatch for each stage's jobs, timed on the project's
   own `StageRunner`s with the threads a local swarm gives each peer: a forward job (decode the
   inbound message, forward, encode the activation), the tail's forward-backward job, a backward
   job (decode the gradient, backward, encode the gradient), and the optimizer step; the median
   of `repeats` steps after one warm-up step, measured right before and right after the real
   run and averaged (a shared machine's load changes; `before_over_after` says by how much);
2. the real swarm: `swarm local` (`run_local`) with the same spec, replicas, steps, bandwidth
   and latency (every peer's uplink and downlink shaped by the built-in shaper); its tokens/s
   leaves out the first step;
3. the simulator with those seconds, every peer on this machine's cores (`SharedCores`), the same
   links (`HomeLink` of the same rate and latency, symmetric) and the same steps; and again with
   every frame delayed by the transport's own round trip on this machine (`transport_seconds`: a
   request of the case's activation size and its empty reply between two `Transport`s over two
   real p2pd daemons, unshaped, measured after the real run), a cost the plain model leaves out;
4. and calibrated: the real swarm of the same shape run again without link limits, the per-frame delay
   at which the simulator's unshaped step equals that run's median step fitted (`fitted_frame_s`: the
   swarm's own cost per message on this machine), and the shaped case simulated with it. The fit
   sees no link; what the shaped comparison then tests is what the model adds for the links.

Writes simulate_validation.json (and simulate_validation.png: the real, simulated and calibrated rates per
case) into --out.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from peer.runner.stage import StageRunner
from protocol.codecs import WirePacker
from protocol.model import spec_basis
from protocol.spec import RunSpec, preset
from protocol.wire import (
    ActivationMessage,
    GradientMessage,
    Header,
    WireLimits,
    decode_message,
    encode_message,
    tokens_for_wire,
)
from swarm.bench.common.machine import machine_info, torch_threads
from swarm.net.shaper import parse_bandwidth, parse_latency

from .engine import SharedCores
from .hardware import LinkDraw, StageWork, WireBytes, wire_bytes
from .run import SimSetup, simulate


@dataclass(frozen=True)
class Case:
    codec: str
    replicas: int
    bandwidth: str
    latency: str
    replica_sync: str = "exact"


CASES = (Case("subspace", 1, "20mbit", "20ms"), Case("dense", 1, "20mbit", "20ms"),
         Case("subspace", 2, "20mbit", "20ms"), Case("dense", 2, "50mbit", "20ms"))


def calibrate(spec: RunSpec, threads: int, repeats: int = 3, device: str = "cpu") -> StageWork:
    """Measured seconds per microbatch of each stage's jobs on this CPU, or on `device` (module docstring); on a
    GPU each job's clock stops once the device is done with it (`_done`), as a worker thread's next job waits."""
    with torch_threads(threads):
        basis = spec_basis(spec)
        runners = [StageRunner(spec, s, device, basis) for s in range(spec.n_stages)]
        packer, g = WirePacker.for_spec(spec), torch.Generator().manual_seed(spec.data_seed)
        n = spec.n_stages
        times: dict[str, list[list[float]]] = {k: [[] for _ in range(n)] for k in ("fwd", "bwd", "apply")}
        for step in range(repeats + 1):
            for mb in range(spec.n_microbatches):
                tokens = torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1), generator=g)
                _timed_microbatch(spec, runners, packer, step, mb, tokens, times, step > 0)
            for s, r in enumerate(runners):
                t0 = time.perf_counter()
                r.optimizer_step()
                _done(device)
                if step > 0:
                    times["apply"][s].append(time.perf_counter() - t0)
        med = {k: tuple(statistics.median(x) if x else 0.0 for x in v) for k, v in times.items()}
        return StageWork(med["fwd"], med["bwd"], med["apply"])


def _timed_microbatch(spec: RunSpec, runners: list[StageRunner], packer: WirePacker, step: int, mb: int,
                      tokens: torch.Tensor, times: dict, keep: bool) -> None:
    n = spec.n_stages
    body = None
    for s in range(n):
        t0 = time.perf_counter()
        z = None
        if body is not None:
            msg = decode_message(body, WireLimits.for_spec(spec, runners[s].basis_version))
            z = packer.unpack(msg.payload, runners[s].dtype)
        if s < n - 1:
            out = runners[s].forward(step, mb, tokens, z)
            h = Header(spec.run_hash, step, mb, 0, spec.codec, s + 1)
            body = encode_message(ActivationMessage(h, tokens_for_wire(tokens, spec.vocab), packer.pack(out)))
        else:
            loss, g = runners[s].forward_backward(step, mb, tokens, z)
            g, _ = runners[s].boundary_gradient(mb, g)
            body = encode_message(GradientMessage(Header(spec.run_hash, step, mb, 0, spec.codec, s - 1),
                                                  packer.pack(g), loss))
        _done(runners[s].device)
        if keep:
            times["fwd"][s].append(time.perf_counter() - t0)
    for s in range(n - 2, -1, -1):
        t0 = time.perf_counter()
        msg = decode_message(body, WireLimits.for_spec(spec, runners[s].basis_version))
        g = runners[s].backward(step, mb, packer.unpack(msg.payload, runners[s].dtype))
        if s > 0:
            g, _ = runners[s].boundary_gradient(mb, g)
            body = encode_message(GradientMessage(Header(spec.run_hash, step, mb, 0, spec.codec, s - 1),
                                                  packer.pack(g), float("nan")))
        _done(runners[s].device)
        if keep:
            times["bwd"][s].append(time.perf_counter() - t0)


def _done(device) -> None:
    """Wait until `device` has run what was queued on it (a CUDA stage's kernels run after the call returns)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


async def _round_trips(sizes: tuple[int, ...], repeats: int) -> dict[int, float]:
    """Median seconds of one request of each size and its empty reply between two `Transport`s over two
    real p2pd daemons on this machine, unshaped: what a message costs its two ends and the daemons."""
    from hivemind.p2p import P2P

    from swarm.net.transport import Transport

    async def ack(body: bytes, peer: str) -> bytes:
        return b""

    daemons, transports = [], []
    try:
        server_p2p = await P2P.create(host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        daemons.append(server_p2p)
        maddrs = [str(m) for m in await server_p2p.get_visible_maddrs()]
        client_p2p = await P2P.create(initial_peers=maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
        daemons.append(client_p2p)
        server, client = Transport(server_p2p, "calibrate"), Transport(client_p2p, "calibrate")
        transports += [server, client]
        await server.serve("act", ack)
        out = {}
        for n in sizes:
            times = []
            for i in range(repeats + 2):
                t0 = time.perf_counter()
                await client.request(server_p2p.peer_id.to_base58(), "act", bytes(n))
                if i >= 2:  # the first two open the stream
                    times.append(time.perf_counter() - t0)
            out[n] = statistics.median(times)
        return out
    finally:
        for t in transports:
            await t.close()
        for d in daemons:
            await d.shutdown()


def transport_seconds(spec: RunSpec, repeats: int = 20) -> float:
    """The median transport round trip of this spec's activation message on this machine (`_round_trips`)."""
    import asyncio
    size = wire_bytes(spec).activation
    return asyncio.run(_round_trips((size,), repeats))[size]


def _mean(a: StageWork, b: StageWork) -> StageWork:
    def avg(x, y):
        return tuple((u + v) / 2 for u, v in zip(x, y))
    return StageWork(avg(a.forward, b.forward), avg(a.backward, b.backward), avg(a.apply, b.apply))


def _total(w: StageWork) -> float:
    return sum(w.forward) + sum(w.backward)


@functools.lru_cache(maxsize=16)
def _wire_bytes(spec: RunSpec) -> WireBytes:
    """`wire_bytes`, once per spec: it lays out every stage (seconds at `record`), and a fit simulates ~16 times."""
    return wire_bytes(spec)


def simulated(spec: RunSpec, work: StageWork, case: Case, steps: int, cores: int, frame_s: float = 0.0,
              schedule: str = "sync") -> dict:
    """One simulated run of `case` (`schedule`: run.py `SimSetup.schedule`)."""
    bps = parse_bandwidth(case.bandwidth)
    rate, lat = (bps or 1e12) / 1e6, parse_latency(case.latency) * 1e3  # unlimited: a link no frame waits on
    setup = SimSetup(spec, work, _wire_bytes(spec), [("this CPU", 1.0)], LinkDraw((rate, rate), (lat, lat)),
                     spec.n_stages * case.replicas, spec.n_microbatches, steps=steps, cores=SharedCores(cores),
                     frame_s=frame_s, schedule=schedule)
    return simulate(setup)


def fitted_frame_s(spec: RunSpec, work: StageWork, case: Case, steps: int, cores: int, real_median_s: float,
                   high_s: float = 0.1, rounds: int = 14) -> float:
    """The per-frame delay at which the simulated swarm of `case`'s shape, unshaped, takes the real unshaped
    swarm's median step (bisection; the simulated step grows with the delay): the swarm's own cost per
    message on this machine (its processes' asyncio, framing, p2pd, the GIL, on shared cores), which the
    stages' timed jobs leave out. Fitted on the unshaped run, then used for the shaped one, so the shaped
    comparison still tests what the model adds for the links."""
    unshaped = Case(case.codec, case.replicas, "unlimited", "0", case.replica_sync)

    def step_s(frame_s: float) -> float:
        return simulated(spec, work, unshaped, steps, cores, frame_s)["median_step_s"]

    low, high = 0.0, high_s
    if step_s(low) >= real_median_s:
        return 0.0
    for _ in range(rounds):
        mid = (low + high) / 2
        low, high = (mid, high) if step_s(mid) < real_median_s else (low, mid)
    return (low + high) / 2


def run_validation(out_dir: str, steps: int = 30, smoke: bool = False, cases: tuple[Case, ...] = CASES) -> dict:
    from swarm.local import LocalOptions, run_local

    if smoke:
        steps, cases = 4, cases[:1]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    rows = []
    for case in cases:
        spec = preset("tiny", codec=case.codec, replica_sync=case.replica_sync)
        threads = max(1, cores // (spec.n_stages * case.replicas + 1))  # as swarm local gives each process
        before = calibrate(spec, threads, repeats=1 if smoke else 3)
        t0 = time.perf_counter()
        shaped = parse_bandwidth(case.bandwidth) is not None
        real = run_local(LocalOptions(spec, steps=steps, replicas=case.replicas,
                                      bandwidth=case.bandwidth if shaped else None,
                                      latency=case.latency, quiet=True, threads=threads))
        real_s = time.perf_counter() - t0
        after = calibrate(spec, threads, repeats=1 if smoke else 3)  # the machine's load may have changed
        work = _mean(before, after)
        sim = simulated(spec, work, case, steps, cores)
        frame_s = transport_seconds(spec, repeats=5 if smoke else 20)
        with_transport = simulated(spec, work, case, steps, cores, frame_s)
        # the swarm's own cost per message, fitted on a real run of the same shape without link limits
        bare = run_local(LocalOptions(spec, steps=steps, replicas=case.replicas, bandwidth=None, latency="0",
                                      quiet=True, threads=threads))
        bare_median = statistics.median(s["seconds"] for s in bare["steps"][1:])
        fitted = fitted_frame_s(spec, work, case, steps, cores, bare_median)
        calibrated = simulated(spec, work, case, steps, cores, fitted)
        row = {"preset": "tiny", "stages": spec.n_stages, **case.__dict__, "steps": steps, "threads": threads,
               "cores": cores, "calibration": {"forward_s": work.forward, "backward_s": work.backward,
                                               "apply_s": work.apply,
                                               "before_over_after": _total(before) / _total(after)},
               "real_tokens_per_second": real["tokens_per_second"], "real_wall_s": real_s,
               "simulated_tokens_per_second": sim["tokens_per_second"], "simulated": sim,
               "ratio": sim["tokens_per_second"] / max(real["tokens_per_second"], 1e-9),
               "transport_round_trip_s": frame_s,
               "simulated_with_transport_tokens_per_second": with_transport["tokens_per_second"],
               "ratio_with_transport": with_transport["tokens_per_second"] / max(real["tokens_per_second"], 1e-9),
               "unshaped_real_tokens_per_second": bare["tokens_per_second"], "unshaped_real_median_step_s": bare_median,
               "fitted_frame_s": fitted, "simulated_calibrated_tokens_per_second": calibrated["tokens_per_second"],
               "simulated_calibrated": calibrated,
               "ratio_calibrated": calibrated["tokens_per_second"] / max(real["tokens_per_second"], 1e-9),
               "real_median_step_s": statistics.median(s["seconds"] for s in real["steps"][1:]),
               "real_mean_step_s": statistics.mean(s["seconds"] for s in real["steps"][1:]),
               "real_max_step_s": max(s["seconds"] for s in real["steps"][1:]),
               "real_commit_s": real.get("sync", {}).get("commit_seconds")}
        rows.append(row)
        print(f"tiny {spec.n_stages}x{case.replicas} {case.codec} {case.bandwidth} {case.latency}: real "
              f"{row['real_tokens_per_second']:.0f} tok/s, simulated {row['simulated_tokens_per_second']:.0f} "
              f"(x{row['ratio']:.2f}); with the measured transport round trip ({1e3 * frame_s:.1f} ms a frame) "
              f"{row['simulated_with_transport_tokens_per_second']:.0f} (x{row['ratio_with_transport']:.2f}); with the "
              f"swarm's cost per frame fitted unshaped ({1e3 * fitted:.1f} ms) "
              f"{row['simulated_calibrated_tokens_per_second']:.0f} (x{row['ratio_calibrated']:.2f})", flush=True)
    result = {"device": "cpu", "devices": ["cpu"], "machine": machine_info(["cpu"]), "cases": rows,
              "load_average": os.getloadavg()}
    (out / "simulate_validation.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(rows, out / "simulate_validation.png")
    return result


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.8))
    names = [f"{r['stages']}x{r['replicas']} {r['codec']}\n{r['bandwidth']} {r['latency']}" for r in rows]
    x = range(len(rows))
    ax.bar([i - 0.27 for i in x], [r["real_tokens_per_second"] for r in rows], 0.27, label="real swarm (swarm local)")
    ax.bar(list(x), [r["simulated_tokens_per_second"] for r in rows], 0.27, label="simulated")
    ax.bar([i + 0.27 for i in x], [r["simulated_calibrated_tokens_per_second"] for r in rows], 0.27,
           label="simulated, cost per frame fitted unshaped")
    for i, r in enumerate(rows):
        top = max(r[k] for k in ("real_tokens_per_second", "simulated_tokens_per_second",
                                 "simulated_calibrated_tokens_per_second"))
        ax.text(i, top, f"x{r['ratio']:.2f} / x{r['ratio_calibrated']:.2f}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), names, fontsize=7)
    ax.set_ylabel("tokens / s")
    ax.set_title("tiny on this CPU: real swarm vs the simulator calibrated to it", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
