"""Serving from behind a NAT: a peer nobody can dial is reached through a relay.

libp2p's circuit relay (v2): a peer that cannot be dialed keeps a connection to a relay (here:
its initial peers, the coordinator first; every swarm node runs p2pd's relay service) and
holds a reservation there; others dial `<relay address>/p2p/<relay id>/p2p-circuit` and the
relay splices the two connections. Such a peer:

- announces only its circuit addresses (nothing else of it can be dialed);
- runs its DHT node in client mode (it asks, but others cannot ask it: Petals does the same);
- is slower to reach (two hops, through someone else's uplink): routers penalise it.

p2pd takes its relays either from a static list or by discovery; with discovery it waits for
four candidates or three minutes before it reserves anything, so we give it a static list
(`-trustedRelays`, `-relayDiscovery=0`). hivemind 1.1 has no argument for the second flag:
`_static_relays` adds it where hivemind builds p2pd's command line, and only when both
auto-relay and trusted relays are asked for (so no other p2pd changes). The patch is made in
this process before the DHT's child process is forked from it, which inherits it.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Sequence

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    from hivemind.p2p import P2P

from .addresses import is_circuit, swarm_scope, usable

__all__ = ["relay_options", "circuit_addresses"]


def circuit_addresses(relays: Sequence[str]) -> list[str]:
    """Where a peer holding a reservation on each of `relays` (full multiaddrs with /p2p/ID) can be dialed."""
    return [f"{r}/p2p-circuit" for r in relays if "/p2p/" in r and not is_circuit(r)]


def relay_options(initial_peers: Sequence[str]) -> dict:
    """hivemind.DHT/P2P keyword arguments for a peer that serves through relays (its usable initial peers)."""
    relays = usable(initial_peers, swarm_scope(initial_peers))
    if not circuit_addresses(relays):
        raise ValueError("a relayed peer needs an initial peer with its /p2p/ id to use as a relay, e.g. "
                         "/ip4/203.0.113.7/tcp/31337/p2p/12D3KooW...")
    _static_relays()
    return {"use_relay": True, "use_auto_relay": True, "force_reachability": "private",
            "trusted_relays": list(relays), "announce_maddrs": circuit_addresses(relays)}


@functools.cache
def _static_relays() -> None:
    make_args = P2P._make_process_args

    def with_static_relays(*args, **kwargs):
        if kwargs.get("autoRelay") and kwargs.get("trustedRelays"):
            kwargs.setdefault("relayDiscovery", False)
        return make_args(*args, **kwargs)

    P2P._make_process_args = staticmethod(with_static_relays)
