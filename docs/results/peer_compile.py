"""Issue 54, item 1 (the peer side of --compile), on one GPU: how far a compiled stage's gradients are from the
eager one's and from another compiled copy's (what a spot check compares against TOLERANCE,
peer/checks/share_check.py), and the speed of one stage's forward+backward both ways. Writes JSON to argv[1].

    python3 docs/results/peer_compile.py OUT.json [preset]
"""
from __future__ import annotations

import json
import sys
import time

import torch

from peer.checks.share_check import TOLERANCE
from protocol.model import build_stage
from protocol.spec import COMPUTE_DTYPES, preset


def grads_and_seconds(module, tokens: torch.Tensor, repeats: int) -> tuple[torch.Tensor, list[float]]:
    seconds = []
    for _ in range(repeats):
        module.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = module(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    flat = torch.cat([p.grad.flatten().double() for p in module.parameters() if p.grad is not None])
    return flat, seconds


def main() -> None:
    out, name = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "large"
    spec = preset(name, stages=1, codec="dense", dtype="bf16")
    eager = build_stage(spec, 0).cuda()
    compiled = build_stage(spec, 0).cuda()
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_blocks()
    again = build_stage(spec, 0).cuda()  # compiled apart: what another replica of a compiled run computes
    again.load_state_dict(eager.state_dict())
    again.compile_blocks()
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, spec.vocab, (spec.microbatch_size, spec.seq_len + 1), generator=g).cuda()
    a, eager_s = grads_and_seconds(eager, tokens, 8)
    b, compiled_s = grads_and_seconds(compiled, tokens, 8)  # the first call compiles
    c, _ = grads_and_seconds(again, tokens, 2)
    off = ((a - b).norm() / a.norm()).item()
    alike = ((b - c).norm() / b.norm()).item()
    tol = TOLERANCE[COMPUTE_DTYPES[spec.dtype]]
    result = {"preset": name, "dtype": spec.dtype, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "microbatch_tokens": spec.microbatch_size * spec.seq_len,
              "relative_gradient_difference": off, "tolerance": tol, "inside_tolerance": off <= tol,
              "compiled_vs_compiled_difference": alike,
              "eager_seconds": eager_s, "compiled_seconds": compiled_s,
              "speedup_steady": (sum(eager_s[2:]) / len(eager_s[2:])) / (sum(compiled_s[2:]) / len(compiled_s[2:]))}
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_seconds")}))


if __name__ == "__main__":
    main()
