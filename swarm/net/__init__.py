"""Moving bytes between peers.

- `transport.py`: `Transport`, framed request/reply messages over hivemind's libp2p streams,
  with every byte counted per peer, kind and direction.
- `framing.py`: what both routes share: frame sizes, `TransportError`, `LinkCounter`, `framing_bytes`.
- `direct.py`: `DirectServer` and `DirectDialer`, the direct TCP channel that carries a transport's large
  frames between peers that can dial each other, each frame tagged with a key handed out over libp2p;
  `direct_route.py`: `DirectRoute`, the transport's side of it (`Transport.enable_direct`).
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
from .transport import REPLY_OVERHEAD, REQUEST_OVERHEAD, LinkCounter, Transport, TransportError, framing_bytes

__all__ = ["HomeLink", "LinkCounter", "LinkShaper", "REPLY_OVERHEAD", "REQUEST_OVERHEAD", "Transport", "TransportError",
           "framing_bytes", "parse_bandwidth", "parse_latency"]
