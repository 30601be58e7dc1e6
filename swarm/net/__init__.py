"""Moving bytes between peers.

- `transport.py`: `Transport`, framed request/reply messages over hivemind's libp2p streams,
  with every byte counted per peer, kind and direction.
- `shaper.py`: `LinkShaper`, one emulated uplink (bandwidth shared by the frames in flight,
  burst, latency), and the parsers of "80mbit" and "20ms".
- `send_order.py`: `SendOrder`, a peer's activations and gradients leaving its uplink one at a time, in
  the order sent (so the next stage starts on the first while the rest follow).
- `home_link.py`: `HomeLink`, a peer's emulated home connection (one uplink and one downlink,
  each shared by all its traffic), used by `--bandwidth`/`--latency` and the benchmarks.
- `namespaces.py`: `KernelLinks`, the same links shaped by the kernel (network namespaces, tc tbf).
"""
from .home_link import HomeLink
from .shaper import LinkShaper, parse_bandwidth, parse_latency
from .transport import REPLY_OVERHEAD, REQUEST_OVERHEAD, LinkCounter, Transport, TransportError

__all__ = ["HomeLink", "LinkCounter", "LinkShaper", "REPLY_OVERHEAD", "REQUEST_OVERHEAD", "Transport", "TransportError",
           "parse_bandwidth", "parse_latency"]
