"""The network of peers: DHT records, libp2p transport, routing, coordinator, launcher, CLI."""

__version__ = "0.1.0"
