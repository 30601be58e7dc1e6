"""Which elementwise torch operations give the GPU the CPU's bits (docs/algorithms.md 5.3)? Each op on the same
random fp32 (and fp64) inputs, on the CPU and on CUDA; prints the fraction of elements whose bits differ.
Usage: python docs/results/elementwise_bits.py OUT"""
import json
import sys
from pathlib import Path

import torch

g = torch.Generator().manual_seed(0)
n = 4_000_000
rows = {}
for dtype in (torch.float32, torch.float64):
    a = (torch.randn(n, generator=g) * 1e-3).to(dtype)
    b = (torch.rand(n, generator=g) * 1e-6 + 1e-9).to(dtype)
    c = torch.randn(n, generator=g).to(dtype)
    ops = {
        "mul_scalar": lambda a, b, c: a * 0.9,
        "mul_recip_scalar": lambda a, b, c: b * (1 / (1 - 0.999 ** 3)),
        "div_scalar": lambda a, b, c: b / (1 - 0.999 ** 3),
        "add": lambda a, b, c: a + c,
        "add_alpha": lambda a, b, c: a.clone().add_(c, alpha=0.1),
        "mul": lambda a, b, c: a * c,
        "square": lambda a, b, c: a * a,
        "div": lambda a, b, c: a / (b.sqrt() + 1e-8),
        "sqrt": lambda a, b, c: b.sqrt(),
        "add_scalar": lambda a, b, c: b + 1e-8,
        "addcdiv": lambda a, b, c: c.clone().addcdiv_(a, b.sqrt() + 1e-8, value=-1e-3),
        "round": lambda a, b, c: torch.round(c * 1e5),
        "div_in_fp64": lambda a, b, c: (a.double() / (b.double().sqrt() + 1e-8)).to(a.dtype),
    }
    for name, op in ops.items():
        cpu = op(a, b, c)
        gpu = op(a.cuda(), b.cuda(), c.cuda()).cpu()
        as_bytes = [t.view(-1).numpy().view("u1").reshape(n, -1) for t in (cpu, gpu)]
        differ = (as_bytes[0] != as_bytes[1]).any(1)
        rows[f"{name}/{str(dtype)[6:]}"] = float(differ.mean())
        print(name, dtype, rows[f"{name}/{str(dtype)[6:]}"], flush=True)
out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
(out / "elementwise-bits.json").write_text(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                                                       "fraction_differing": rows}, indent=1) + "\n")
