"""Local swarms' speed, loss against tokens and time, and the public record's setting (no module imported here:
the benches are imported when they run):

- `throughput.py`: `swarm bench throughput`: tokens/s of whole local swarms per codec, unlimited vs limited links.
- `convergence.py`: `swarm bench convergence`: held-out loss against tokens, fixed U vs re-fitted U vs dense.
- `time_to_loss.py`: held-out loss against wall-clock time, from convergence's curves and measured tokens/s.
- `bench.py`: `swarm bench record`: the public slow-link record's setting (d=1024, 8 stages, 200 Mbit/s, 50 ms):
  time to dense's final loss per codec, from convergence's curves and throughput's swarms.
- `variants.py`: what the record bench trains, by name (no torch: the CLI reads it).
- `cli.py`: the subcommands of throughput, convergence and record, and what runs them.
"""
