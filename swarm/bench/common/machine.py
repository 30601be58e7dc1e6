"""What a benchmark really ran on, for its JSON: the devices it used and the machine (host,
CPU model and cores, and the GPU behind each CUDA device). Absolute figures (tokens/s,
FLOP/s) mean something only next to these, so every bench that writes a JSON records them
through `machine_info`. And `torch_threads`, the CPU threads a bench lets torch use.
"""
from __future__ import annotations

import os
import platform
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` for the block, then put back. An in-memory swarm runs
    its peers' worker threads in one process, and each worker that enters a parallel region (a CPU QR,
    a matmul) starts a team of that many threads: left at the core count, 6 peers ran 6 x cores
    threads, and a rank-64 powersgd reduce at `small` took 3.05 s a step instead of 0.44 s on a 16-core GPU
    machine (its CPU QR's threads spinning; docs/benchmarks.md, replica sync)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(max(1, threads))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def per_peer_threads(peers: int) -> int:
    """The cores of this machine shared out among `peers` (as `swarm local` gives each process)."""
    return max(1, (os.cpu_count() or 1) // max(1, peers))


def devices_used(device: str, devices: str | Sequence[str] | None = None) -> list[str]:
    """The devices a run used: `devices` (comma-separated, as --devices takes them) when given,
    else `device` alone."""
    if isinstance(devices, str):
        devices = [d.strip() for d in devices.split(",") if d.strip()]
    return list(devices) if devices else [device]


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what `platform` knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name(device: str) -> str:
    """The name of the GPU behind a CUDA device, e.g. "NVIDIA H100 80GB HBM3"."""
    try:
        return torch.cuda.get_device_name(torch.device(device))
    except (RuntimeError, AssertionError, ValueError) as e:  # no CUDA here, or no such device
        return f"unknown GPU ({e})"


def machine_info(devices: Sequence[str]) -> dict:
    """The machine a bench ran on: {"host", "cpu", "cores", "gpus" (device -> GPU name, for the
    CUDA devices among `devices`), "description"}, the description one line such as
    "AMD EPYC 9654 (16 cores); cuda:0, cuda:1: 2 x NVIDIA H100 80GB HBM3"."""
    cpu, cores = cpu_model(), os.cpu_count() or 0
    gpus = {d: gpu_name(d) for d in dict.fromkeys(devices) if torch.device(d).type == "cuda"}
    description = f"{cpu} ({cores} cores)"
    if gpus:
        names = list(gpus.values())
        kinds = ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))
        description += f"; {', '.join(gpus)}: {kinds}"
    return {"host": platform.node(), "cpu": cpu, "cores": cores, "gpus": gpus, "description": description}
