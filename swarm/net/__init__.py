"""Moving bytes between peers.

- `transport.py`: `Transport`, framed request/reply messages over hivemind's libp2p streams,
  with every byte counted per peer, kind and direction.
- `shaper.py`: `LinkShaper`, the token-bucket emulation of a home link (bandwidth, latency)
  used by `--bandwidth`/`--latency` and the benchmarks.
"""
from .shaper import LinkShaper, parse_bandwidth, parse_latency
from .transport import REPLY_OVERHEAD, REQUEST_OVERHEAD, LinkCounter, Transport, TransportError

__all__ = ["LinkCounter", "LinkShaper", "REPLY_OVERHEAD", "REQUEST_OVERHEAD", "Transport", "TransportError",
           "parse_bandwidth", "parse_latency"]
