"""A stage's replicas on unlike machines hold the same bits: building a stage and applying agreed gradients
to it (unpack, clip, the optimizer, a basis switch) give one state hash whatever the machine computes with.
Here the machines differ in thread count (BLAS blocking and reduction order change with it) and in the CPU's
vector unit torch and MKL use; on a GPU host also CPU against GPU (docs/algorithms.md 5.3)."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from peer.runner.stage import StageRunner
from peer.runner.state_hash import state_sha256
from protocol.portable_linalg import portable_orthonormalize
from protocol.spec import preset


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _agreed(runner: StageRunner, steps: int) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """What a reduce would hand every replica, step by step: a flat gradient in the layout (and a statistic)."""
    g = torch.Generator().manual_seed(5)
    stat = runner.stat
    # drawn in fp64 and rounded: torch's fp32 randn gives other numbers on another CPU's vector unit
    return [((torch.randn(runner.layout.numel, generator=g, dtype=torch.float64) * 0.05).float(),
             torch.randn(stat.shape, generator=g, dtype=torch.float64).to(stat.dtype) if stat is not None else None)
            for _ in range(steps)]


def _new_basis(spec) -> torch.Tensor:
    """A re-fit's basis: the coordinator's bits, the same for every replica."""
    U = StageRunner(spec, 0).basis.U.double()
    return portable_orthonormalize([U + 0.05 * torch.randn(U.shape, generator=torch.Generator().manual_seed(9),
                                                           dtype=torch.float64)])[0]


def _replica(spec, stage: int, device: str, n_threads: int | None, steps: int, U_new: torch.Tensor) -> StageRunner:
    """Build the stage and apply `steps` agreed gradients, with a basis switch after the second."""
    if n_threads is not None:
        torch.set_num_threads(n_threads)
    runner = StageRunner(spec, stage, device)
    for step, (flat, stat) in enumerate(_agreed(runner, steps)):
        runner.apply_flat(step, flat.to(device), None if stat is None else stat.to(device))
        if step == 1 and runner.basis is not None:
            runner.switch_basis(replace(runner.basis, U=U_new.to(runner.basis.U), version=1))
    return runner


def _tensors(obj, name: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a state dict by its path (to name the ones that differ)."""
    if isinstance(obj, torch.Tensor):
        return {name: obj.detach().cpu().contiguous()}
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    return {k: v for key, value in items for k, v in _tensors(value, f"{name}/{key}").items()}


def _same_bits(a: StageRunner, b: StageRunner) -> None:
    ta, tb = _tensors(a.state_dict()), _tensors(b.state_dict())
    differ = [k for k in ta if ta[k].numpy().tobytes() != tb[k].numpy().tobytes()]
    assert not differ, f"{len(differ)} of {len(ta)} tensors differ, e.g. {differ[:6]}"
    assert state_sha256(a.state_dict()) == state_sha256(b.state_dict())


@pytest.mark.parametrize("stage", [0, 2])
def test_replicas_with_other_thread_counts_hold_the_same_bits(threads, stage):
    spec = preset("small", codec="subspace", stages=3)  # d=512: large enough that BLAS splits its work
    U_new = _new_basis(spec)
    first = _replica(spec, stage, "cpu", 1, 4, U_new)
    for n in (2, 3):
        _same_bits(first, _replica(spec, stage, "cpu", n, 4, U_new))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="comparing devices needs a GPU")
def test_a_gpu_replica_holds_the_cpu_replicas_bits():
    torch.backends.cuda.matmul.allow_tf32 = False
    spec = preset("small", codec="subspace", stages=3)
    U_new = _new_basis(spec)
    _same_bits(_replica(spec, 1, "cpu", None, 4, U_new), _replica(spec, 1, "cuda", None, 4, U_new))


_STAGE_HASHES = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_portable_apply import _new_basis, _replica
from peer.runner.state_hash import state_sha256
from protocol.spec import preset
spec = preset("small", codec="subspace", stages=3)
U_new = _new_basis(spec)
print(torch.backends.cpu.get_cpu_capability(), *(state_sha256(_replica(spec, s, "cpu", int(sys.argv[2]), 4, U_new)
                                                             .state_dict()) for s in (0, 2)))
"""


@pytest.mark.e2e
def test_replicas_on_cpus_with_other_vector_units_hold_the_same_bits():
    """Two processes, one with this CPU's own vector unit and torch's fastest kernels for it, one as a CPU without
    any (ATEN_CPU_CAPABILITY=default, MKL on SSE4.2), and with other thread counts: one state hash per stage."""
    here = str(Path(__file__).parent)
    runs = [({}, "2"), ({"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}, "1")]
    procs = [subprocess.Popen([sys.executable, "-c", _STAGE_HASHES, here, n], env={**os.environ, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for env, n in runs]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        outs.append(out.split())
    units = {o[0] for o in outs}
    if len(units) < 2:
        pytest.skip(f"this CPU's own vector unit is torch's default one ({units.pop()}): nothing to compare")
    assert outs[0][1:] == outs[1][1:], f"stage hashes differ between {outs[0][0]} and {outs[1][0]}"
