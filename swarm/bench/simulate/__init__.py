"""`swarm bench simulate`: a discrete-event simulation of 10-1,000 home GPUs running the project's router and
placement: tokens/s against N, churn and codec (no module imported here: the bench is imported when it runs).

- `bench.py`: the bench: the N curve, the churn curve, simulate.json and a PNG.
- `engine.py`: asyncio on a virtual clock, and the workers that stand for GPUs and CPU cores.
- `hardware.py`: the GPU table, stage FLOPs, message and sync bytes, home links.
- `peers.py`: the peers over the real `Router` and placement, their directory, links and churn.
- `step.py`: what the leading head's step driver and every stage do with one step.
- `run.py`: one simulated swarm, built, driven and summed up.
- `report.py`: what the runs conclude (home GPUs per A100/H100), and the plot.
- `validate.py`: `--validate`: the simulator against real local swarms on this CPU.
- `record_measure.py`: `--record-setting`'s measured side: the record bench's swarms, calibrated and run for real.
- `record_setting.py`: `--record-setting`: the simulator's prediction for the record's setting beside them.
- `cli.py`: the subcommand and what runs it.
"""
