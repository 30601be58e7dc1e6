"""The single-process oracle's training runs, each computed once per test session.

Many tests compare a swarm with the in-process pipeline (`peer/runner/pipeline.py`) trained on the
same run spec and the embedded corpus. That run is deterministic (seeded weights and data, one
torch thread, as in the swarm's peers), and its first n steps are the same whatever number of
steps follows them, so one run per spec serves every test that asks for it: a test that asks
for more steps than were run continues the run, one that asks for fewer reads its beginning.
`tests/conftest.py` hands out one `OracleRuns` per session (the `oracle_runs` fixture).
The weights after n steps are kept too (`weights`), for the tests that compare every stage's
parameters with the one-process run's.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from peer.replica.memory_swarm import batches
from peer.runner.pipeline import InProcessPipeline
from protocol.spec import RunSpec


@dataclass
class _Run:
    """One spec's pipeline, its data, and what each step gave so far."""

    pipe: InProcessPipeline
    data: Callable[[int, int], torch.Tensor]  # (step, microbatch) -> tokens
    losses: list[float] = field(default_factory=list)
    log_lengths: list[int] = field(default_factory=list)  # len(pipe.basis_log) after each step


class OracleRuns:
    """Per-step losses and basis switches of the in-process pipeline, by run spec."""

    def __init__(self) -> None:
        self._runs: dict[str, _Run] = {}
        self._weights: dict[tuple[str, int], list[list[torch.Tensor]]] = {}

    def _run(self, spec: RunSpec, steps: int) -> _Run:
        key = spec.to_json()
        if key not in self._runs:
            self._runs[key] = _Run(InProcessPipeline(spec), batches(spec))
        return _advance(self._runs[key], steps)

    def losses(self, spec: RunSpec, steps: int) -> list[float]:
        """The loss of each of the first `steps` steps (step 1 first)."""
        return list(self._run(spec, steps).losses[:steps])

    def basis_log(self, spec: RunSpec, steps: int) -> list[tuple[int, int]]:
        """(version, effective step) of each re-fit scheduled within the first `steps` steps."""
        run = self._run(spec, steps)
        return list(run.pipe.basis_log[: run.log_lengths[steps - 1]]) if steps else []

    def weights(self, spec: RunSpec, steps: int) -> list[list[torch.Tensor]]:
        """Each stage's parameters (copies) after the first `steps` steps."""
        key = (spec.to_json(), steps)
        if key not in self._weights:
            run = self._run(spec, 0)
            # the shared run stops at `steps` unless it went further already; then one apart, from step 0
            run = self._run(spec, steps) if len(run.losses) <= steps else _advance(
                _Run(InProcessPipeline(spec), batches(spec)), steps)
            self._weights[key] = [[p.detach().clone() for p in r.module.parameters()] for r in run.pipe.runners]
        return self._weights[key]


def _advance(run: _Run, steps: int) -> _Run:
    """Train `run` on to `steps` steps, on one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # fp32 sums in the peers' order, whichever test asks first
    try:
        while len(run.losses) < steps:
            run.losses.append(run.pipe.train_step(len(run.losses), run.data).loss)
            run.log_lengths.append(len(run.pipe.basis_log))
    finally:
        torch.set_num_threads(threads)
    return run
