"""What every bench shares (no bench imported here; nothing heavy):

- `machine.py`: the devices and machine every bench's JSON records, and the torch threads a bench trains on.
- `flags.py`: the flags most `swarm bench` subcommands take (--out, --smoke, --device, --preset, --data, --dtype,
  the link), comma-separated argument types, and --dtype auto resolved.
"""
