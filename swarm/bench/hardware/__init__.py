"""What one machine does, bench by bench (no module imported here: the benches are imported when they run):

- `codecs.py`: `swarm bench codecs`: bytes per token and encode/decode time per codec and width.
- `mfu.py`: `swarm bench mfu`: the device's bf16 matmul rate and the share of it that training the whole model uses.
- `memory.py`: `swarm bench memory`: each stage's peak GPU memory against `peer/runner/memory_estimate.py`, and
  the smallest card it fits (also `python -m swarm.bench.hardware.memory`).
- `transport.py`: `swarm bench transport`: MB/s of raw TCP, the libp2p daemons and our Transport on loopback, and
  the tokens/s that caps between two stages per preset and codec.
- `scale.py`: `swarm bench scale`: tokens/s against GPUs: layouts of stages x replicas vs one process.
- `data_memory.py`: `python -m swarm.bench.hardware.data_memory`: a head's resident memory for data on a generated
  prepared corpus of GBs.
- `flags.py`: these benches' flags; `cli.py`: their subcommands and what runs them.
"""
