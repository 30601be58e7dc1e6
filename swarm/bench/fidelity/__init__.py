"""`swarm bench fidelity`: does the subspace model train as well as dense, and why not (docs/fidelity.md)? No
module imported here: the bench is imported when it runs.

- `bench.py`: the bench: a plan's jobs spread over GPUs inside a time budget; fidelity.json, .md and a PNG.
- `plan.py`: the jobs of each plan, grouped by the question they answer.
- `queue.py`: worker processes taking jobs in priority order, each result written as it finishes.
- `train.py`: one job: a run spec trained in process and its held-out loss.
- `report.py`: the tables and the figure, from the job results.
- `learned_boundary.py`, `rvq_boundary.py`: diagnostics of the gap: learned per-stage projections; the hybrid's
  lossy numbers sent as residual-VQ codes (one process each).
- `fp16.py`: `python -m swarm.bench.fidelity.fp16`: fp16 with loss scaling against bf16 held-out loss.
- `cli.py`: the subcommand and what runs it.
"""
