"""`swarm bench BENCH`: each benchmark has its own flags (and --help lists only those, each with
its default), invocations the docs show still parse and reach the right bench, and every
bench's JSON records the devices and the machine it really ran on."""
from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest
import torch

from protocol.spec import preset
from swarm.bench.common.machine import devices_used, machine_info
from swarm.bench.record.throughput import throughput_record
from swarm.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
BENCHES = ["codecs", "throughput", "convergence", "mfu", "replicas", "replica-sync", "verify", "share-tolerance",
           "fidelity", "churn", "memory", "record", "simulate", "transport", "scale"]


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args([*argv, "--help"])
    assert e.value.code == 0
    return capsys.readouterr().out


def _bench_parsers() -> dict[str, argparse.ArgumentParser]:
    def subparsers(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        return next(a for a in p._actions if isinstance(a, argparse._SubParsersAction)).choices
    return subparsers(subparsers(build_parser())["bench"])


def test_each_bench_help_lists_only_its_own_flags(capsys):
    fidelity = _help(capsys, "bench", "fidelity")
    assert "--budget-s" in fidelity and "--plan" in fidelity
    for other in ("--sync-rank", "--seeds", "--kernel-shaping", "--matmul-size", "--curves-json"):
        assert other not in fidelity
    sync = _help(capsys, "bench", "replica-sync")
    assert "--sync-rank" in sync and "--bandwidth" in sync
    for other in ("--budget-s", "--plan", "--parallel", "--matmul-size", "--devices"):
        assert other not in sync
    codecs = _help(capsys, "bench", "codecs")
    assert "--out" in codecs and "--smoke" in codecs and "--device" not in codecs and "--steps" not in codecs


@pytest.mark.parametrize("argv", [["bench", "fidelity", "--sync-rank", "4"],
                                  ["bench", "replica-sync", "--budget-s", "3"],
                                  ["bench", "codecs", "--device", "cuda"],
                                  ["bench", "mfu", "--devices", "cuda:0,cuda:1"]])
def test_another_bench_flag_is_an_argparse_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_every_bench_has_a_description_and_every_flag_states_its_default():
    parsers = _bench_parsers()
    assert sorted(parsers) == sorted(BENCHES)
    for name, p in parsers.items():
        assert p.description, name
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and "(default: " in action.help, (name, action.option_strings)


def _documented_invocations() -> list[str]:
    """Every `swarm bench ...` command in README.md and docs/*.md (continued lines joined)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        parts = re.sub(r"\\\n\s*", " ", path.read_text()).split("```")
        # outside code blocks, an inline `command` may wrap onto the next line
        text = "".join(part if i % 2 else re.sub(r"`[^`]*`", lambda m: m.group(0).replace("\n", " "), part)
                       for i, part in enumerate(parts))
        for m in re.finditer(r"swarm bench ([a-z][a-z-]*\b[^`#\n]*)", text):
            line = m.group(1).strip().rstrip(",;:)")
            if line.split()[0] in BENCHES and "..." not in line:  # "..." stands for flags left out
                found.append(line)
    return found


def test_the_documented_bench_invocations_parse():
    invocations = _documented_invocations()
    assert len(invocations) >= 15  # README.md, docs/benchmarks.md and docs/fidelity.md show many
    parser = build_parser()
    for line in invocations:
        args = parser.parse_args(["bench", *shlex.split(line)])
        assert args.which == line.split()[0]


@pytest.mark.parametrize("argv, module, function, expected", [
    (["codecs", "--smoke", "--out", "D"], "hardware.codecs", "run_codecs_bench", {"smoke": True}),
    (["throughput", "--devices", "cuda:0,cuda:1", "--bandwidth", "8mbit,80mbit"], "record.throughput",
     "run_throughput_bench", {"preset_name": "small", "steps": 20, "devices": "cuda:0,cuda:1",
                              "bandwidth": "8mbit,80mbit", "latency": "0", "device": "cpu"}),
    (["throughput", "--send-order", "fifo,shared"], "record.throughput", "run_throughput_bench",
     {"send_orders": "fifo,shared", "bandwidth": "80mbit"}),
    (["convergence", "--device", "cuda"], "record.convergence", "run_convergence_bench",
     {"preset_name": "small", "steps": 2000, "data": "stdlib", "device": "cuda", "dtype": None}),
    (["mfu"], "hardware.mfu", "run_mfu_bench", {"preset_name": "large", "codec": "dense", "dtype": "fp32", "steps": 10,
                                       "matmul_n": 8192, "device": "cpu"}),  # --dtype auto on the CPU: fp32
    (["replicas", "--steps", "5"], "replicas.bench", "run_replicas_bench", {"preset_name": "small", "steps": 5}),
    (["replica-sync", "--sync-rank", "2,4"], "replicas.replica_sync", "run_replica_sync_bench",
     {"ranks": (2, 4), "steps": 300, "seeds": 1, "bandwidth": "80mbit", "data": "stdlib", "warmups": (0,)}),
    (["replica-sync", "--sync-warmup", "0,100"], "replicas.replica_sync", "run_replica_sync_bench",
     {"ranks": (8, 32), "warmups": (0, 100)}),
    (["verify", "--replicas", "2"], "replicas.verify", "run_verify_bench",
     {"preset_name": "tiny", "steps": 12, "replicas": 2, "repeats": 2, "stages": 3, "bandwidth": "80mbit",
      "device": "cpu", "dtype": "fp32"}),  # --dtype auto on the CPU: fp32
    (["share-tolerance", "--presets", "tiny", "--device", "cpu"], "replicas.share_tolerance",
     "run_share_tolerance_bench",
     {"presets": ("tiny",), "codecs": ("subspace", "dense"), "device": "cpu", "dtype": "fp32", "warm_steps": 20,
      "steps": 2, "replicas": 3, "data": "stdlib"}),
    (["fidelity", "--groups", "embed,seeds", "--best", '{"lr": 0.002}'], "fidelity.bench", "run_fidelity_bench",
     {"plan": "gpu", "parallel": 1, "per_device": 1, "budget_s": 540.0, "groups": ("embed", "seeds"),
      "best": {"lr": 0.002}, "resume": False, "dense_runs": 1}),
    (["fidelity", "--dense-runs", "3"], "fidelity.bench", "run_fidelity_bench", {"dense_runs": 3}),
    (["churn", "--peer-args=--ttl 6"], "churn.bench", "run_churn_bench",
     {"preset_name": "tiny", "hosts": 6, "replicas": 2, "period": 60.0, "minutes": 15.0, "leader_every": 5,
      "bandwidth": "50mbit", "baseline_minutes": 5.0, "seed": 0, "checkpoint_every": 10, "peer_args": "--ttl 6",
      "coordinator_args": ""}),
    (["memory", "--presets", "paper8b", "--stages", "1"], "hardware.memory", "run_memory_bench",
     {"presets": ["paper8b"], "device": "cuda", "dtype": "fp32" if not torch.cuda.is_available() else
      "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "fp16", "stages": "1", "options": "both",
      "caps": True}),  # --dtype auto: bf16 on a CUDA card that has it, fp16 on one that has not, fp32 without CUDA
    (["record", "--parts", "throughput", "--resume"], "record.bench", "run_record_bench",
     {"tokens": 12_000_000, "bandwidth": "200mbit", "latency": "50ms", "steps": 8, "codec_tokens": 1.0,
      "parts": ("throughput",), "resume": True, "data": "stdlib", "device": "cpu", "variants": None}),
    (["record", "--variants", "dense,subspace-16x-lr0.03"], "record.bench", "run_record_bench",
     {"variants": ("dense", "subspace-16x-lr0.03"), "parts": ("curves", "throughput"), "resume": False}),
    (["simulate", "--peers", "10,100", "--uplink", "10-200", "--lifetimes", "inf,30", "--every-head-works"],
     "simulate.bench", "run_simulate_bench",
     {"preset_name": "large", "codecs": ("dense", "subspace", "bottleneck"), "peers": (10, 100), "uplink": "10-200",
      "latency": "10-150", "mfu": 0.4, "replica_sync": "powersgd", "per_replica": 4, "steps": 8,
      "lifetimes": (float("inf"), 30.0), "churn_peers": 100, "every_head_works": True, "step_timeout": None}),
])
def test_a_bench_invocation_reaches_its_bench_with_its_defaults(argv, module, function, expected, monkeypatch,
                                                                tmp_path):
    import importlib
    calls = []
    monkeypatch.setattr(importlib.import_module(f"swarm.bench.{module}"), function,
                        lambda out, **kw: calls.append((out, kw)))
    assert main(["bench", *argv, "--out", str(tmp_path)]) == 0
    [(out, kw)] = calls
    assert out == str(tmp_path)
    assert {k: kw[k] for k in expected} == expected


def test_the_json_names_the_cuda_devices_and_gpus_it_ran_on(monkeypatch):
    names = {0: "NVIDIA H100 80GB HBM3", 1: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names[torch.device(d).index])
    spec = preset("tiny")
    record = throughput_record("tiny", spec, "cpu", "cuda:0,cuda:1", "0", ["80mbit"], False, None, [], {})
    assert record["device"] == "cuda:0,cuda:1"
    assert record["devices"] == ["cuda:0", "cuda:1"]
    machine = record["machine"]
    assert machine["gpus"] == {"cuda:0": names[0], "cuda:1": names[1]}
    assert machine["cores"] >= 1 and machine["cpu"]
    assert machine["description"] == f"{machine['cpu']} ({machine['cores']} cores); cuda:0, cuda:1: 2 x {names[0]}"
    # without --devices the one --device is what the peers used
    alone = throughput_record("tiny", spec, "cpu", None, "0", ["80mbit"], False, None, [], {})
    assert alone["device"] == "cpu" and alone["devices"] == ["cpu"] and alone["machine"]["gpus"] == {}


def test_machine_info_names_the_cpu_model_and_each_distinct_device():
    assert devices_used("cuda", None) == ["cuda"]
    assert devices_used("cpu", " cuda:0, cuda:1 ") == ["cuda:0", "cuda:1"]
    info = machine_info(["cpu", "cpu"])
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        model = next(line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                     if line.startswith("model name"))
        assert info["cpu"] == model
    assert info["description"] == f"{info['cpu']} ({info['cores']} cores)" and info["gpus"] == {}
