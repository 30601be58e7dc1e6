"""`swarm bench mfu`: how much of the device's bf16 matmul rate training the whole model uses.

Two measurements, side by side in one run on one device:

- the matmul rate R: an n x n by n x n matmul in bf16 (2 n^3 FLOPs; n = 8192 on a GPU), `inner`
  of them between two device synchronisations, the median over `repeats` such timings;
- the training rate: every stage of a preset chained in one process (`ReferenceModel` with
  `boundary=False`: no codec, no wire, one autograd graph per microbatch, each stage's own
  optimizer step), tokens/s over `steps` timed optimizer steps after `warmup` untimed ones,
  synchronised at both ends. Tokens are random ids made on the device beforehand, so no data
  loading is timed.

FLOPs per token F = 6 N + 12 L T d: N the weights multiplied per token (every block's
q, k, v, o, gate, up and down maps and the LM head; not the embedding lookup; a subspace-
constrained map run factored in a bf16 run counts the k (d_in + d) weights it really uses),
6 = 2 forward + 4 backward; 12 L T d is attention's QK^T and AV, forward and backward, with
the causal half counted as PaLM's MFU counts it (`flops_per_token_causal` halves it).
MFU = tokens/s * F / R. Writes mfu.json and mfu.png.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

from protocol.model import SubspaceLinear
from protocol.reference import ReferenceModel
from protocol.spec import RunSpec, preset
from swarm.bench.common.machine import machine_info


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device: torch.device, n: int = 8192, repeats: int = 20, inner: int = 5,
                dtype: torch.dtype = torch.bfloat16) -> dict:
    """FLOP/s of n^3 matmuls in `dtype`: median over `repeats` timings of `inner` back-to-back matmuls."""
    g = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=g).to(device, dtype)
    b = torch.randn(n, n, generator=g).to(device, dtype)
    out = torch.empty(n, n, device=device, dtype=dtype)
    for _ in range(3):  # warm-up: kernel selection, clocks
        torch.matmul(a, b, out=out)
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            torch.matmul(a, b, out=out)
        _sync(device)
        times.append((time.perf_counter() - t0) / inner)
    seconds = statistics.median(times)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "repeats": repeats, "inner": inner,
            "seconds": seconds, "flops_per_second": 2 * n**3 / seconds}


def matmul_weights(stages: list[nn.Module]) -> int:
    """N: weights multiplied once per token in the forward pass (what 6 N counts)."""
    n = 0
    for stage in stages:
        for name, mod in stage.named_modules():
            if isinstance(mod, SubspaceLinear):
                d, k = mod.U.shape
                d_in = mod.A.shape[1] if mod.mode == "reparam" else mod.weight.shape[1]
                n += k * (d_in + d) if mod.factored else d * d_in
            elif isinstance(mod, nn.Linear) and (name.startswith("blocks.") or name == "head"):
                n += mod.in_features * mod.out_features
    return n


def flops_per_token(spec: RunSpec, n_matmul: int, causal: bool = False) -> float:
    """6 N + 12 L T d (the attention term halved if `causal`)."""
    attention = 12 * spec.n_layers * spec.seq_len * spec.d_model
    return 6 * n_matmul + (attention / 2 if causal else attention)


def train_rate(spec: RunSpec, device: torch.device, steps: int, warmup: int, compile_blocks: bool) -> dict:
    """Tokens/s of whole-model training steps (all stages in this process)."""
    model = ReferenceModel(spec, device=str(device), boundary=False)
    if compile_blocks:
        for stage in model.stages:
            stage.compile_blocks()
    g = torch.Generator(device="cpu").manual_seed(spec.data_seed)
    batches = [torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1), generator=g).to(device)
               for _ in range(spec.n_microbatches)]
    losses, step_seconds = [], []
    for i in range(warmup + steps):
        _sync(device)
        t0 = time.perf_counter()
        losses.append(model.train_step(lambda step, mb: batches[mb]))  # reads the loss back: synchronises
        _sync(device)
        if i >= warmup:
            step_seconds.append(time.perf_counter() - t0)
    tokens = spec.batch_size * spec.seq_len
    n_matmul = matmul_weights(model.stages)
    memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"tokens_per_step": tokens, "step_seconds": step_seconds,
            "tokens_per_second": tokens * len(step_seconds) / sum(step_seconds),
            "parameters": sum(p.numel() for m in model.stages for p in m.parameters()),
            "matmul_weights": n_matmul, "losses": losses, "max_memory_bytes": memory}


def run_mfu_bench(out_dir: str, preset_name: str = "large", codec: str = "dense", dtype: str = "bf16",
                  device: str = "cuda", steps: int = 10, warmup: int = 3, matmul_n: int = 8192,
                  microbatch_size: int | None = None, compile_blocks: bool = False, smoke: bool = False) -> dict:
    if smoke:
        preset_name, steps, warmup, matmul_n = "tiny", 2, 1, 256
    spec = preset(preset_name, codec=codec, dtype=dtype, microbatch_size=microbatch_size)
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True  # an fp32 run's matmuls, as the benchmarks run them
    rate = matmul_rate(dev, matmul_n, repeats=5 if smoke else 20, inner=1 if smoke else 5)
    train = train_rate(spec, dev, steps, warmup, compile_blocks)
    flops = flops_per_token(spec, train["matmul_weights"])
    causal = flops_per_token(spec, train["matmul_weights"], causal=True)
    achieved = train["tokens_per_second"] * flops
    result = {
        "preset": preset_name, "codec": codec, "dtype": dtype, "device": device,
        "device_name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "devices": [device], "machine": machine_info([device]),
        "torch": torch.__version__, "compile": compile_blocks, "spec": spec.to_dict(),
        "matmul": rate, "train": train, "flops_per_token": flops, "flops_per_token_causal": causal,
        "model_flops_per_second": achieved, "mfu": achieved / rate["flops_per_second"],
        "mfu_causal": train["tokens_per_second"] * causal / rate["flops_per_second"],
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "mfu.json").write_text(json.dumps(result, indent=1) + "\n")
    _plot(result, out / "mfu.png")
    print(f"matmul {matmul_n}^3 {rate['dtype']}: {rate['flops_per_second'] / 1e12:.1f} TFLOP/s; "
          f"{preset_name} ({codec}, {dtype}{', compiled' if compile_blocks else ''}): "
          f"{train['tokens_per_second']:.0f} tokens/s x {flops / 1e9:.2f} GFLOP/token = "
          f"{achieved / 1e12:.1f} TFLOP/s; MFU {100 * result['mfu']:.1f}% "
          f"({100 * result['mfu_causal']:.1f}% counting causal attention as half)")
    return result


def _plot(result: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    rate = result["matmul"]["flops_per_second"] / 1e12
    model = result["model_flops_per_second"] / 1e12
    a.bar(["bf16 matmul\n(measured)", f"training\n({result['preset']}, {result['dtype']})"], [rate, model],
          color=["tab:gray", "tab:blue"])
    a.set_ylabel("TFLOP/s")
    a.set_title(f"MFU {100 * result['mfu']:.1f}% on {result['device_name']}")
    steps = result["train"]["step_seconds"]
    b.plot(range(1, len(steps) + 1), steps, marker="o")
    b.set_xlabel("timed step")
    b.set_ylabel("seconds")
    b.set_ylim(bottom=0)
    b.set_title(f"{result['train']['tokens_per_second']:.0f} tokens/s")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
