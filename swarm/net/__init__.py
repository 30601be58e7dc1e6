"""Moving bytes between peers.

- `transport.py`: `Transport`, framed request/reply messages over hivemind's libp2p streams,
  with every byte counted per peer, kind and direction.
- `shaper.py`: `HomeLink`, the emulation of a peer's home connection (one shared uplink with
  latency, one shared downlink; token buckets), used by `--bandwidth`/`--latency` and the benchmarks.
"""
from .shaper import HomeLink, LinkShaper, parse_bandwidth, parse_latency
from .transport import REPLY_OVERHEAD, REQUEST_OVERHEAD, LinkCounter, Transport, TransportError

__all__ = ["HomeLink", "LinkCounter", "LinkShaper", "REPLY_OVERHEAD", "REQUEST_OVERHEAD", "Transport", "TransportError",
           "parse_bandwidth", "parse_latency"]
