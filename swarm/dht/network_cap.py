"""At most a few stage announcements per network: an IPv4 /24 or an IPv6 /48 (`ids_per_network`).

Proofs of work make an id cost CPU time; this bounds how many ids one machine (one address
block) can put on a stage, whatever it spends. The run spec names the limit N
(`extra["ids_per_network"]`, coordinator flag `--ids-per-network`, 0 or absent: no limit),
and every reader (`SwarmDHT.stage_peers`) applies it to what it reads.

Only an address this node has seen the peer at counts: the remote address of a live libp2p
connection to that peer id (p2pd's own list: the handshake proves the id, and a TCP
connection's address cannot be forged the way an announced one can). The addresses in an
announcement are the writer's own claims, so they count for nothing here: an outsider that
announces fake ids "at" a victim's addresses cannot crowd the victim out, and cannot escape
the cap by claiming addresses in many networks, because once anyone here dials or hears
from its ids (a router's liveness probe, a DHT request) they are counted where they really
are. Within a network over the limit the ids this reader saw first stay (then by peer id);
the rest are skipped (and logged once each). Not counted, because their network is not
known or not shared with strangers: peers not connected to this node (yet), loopback and
private addresses (LAN and one-machine swarms), and relay circuits (the address seen is the
relay's). docs/security.md says what that leaves open.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence

__all__ = ["IPV4_PREFIX", "IPV6_PREFIX", "cap_per_network", "network_of"]

IPV4_PREFIX, IPV6_PREFIX = 24, 48


def network_of(maddr: str) -> str | None:
    """The /24 (IPv4) or /48 (IPv6) of a public, direct address, e.g. "203.0.114.0/24"; None for anything else
    (loopback, private, relay circuits, DNS names, junk)."""
    if not isinstance(maddr, str) or "/p2p-circuit" in maddr:
        return None
    parts = [p for p in maddr.split("/") if p]
    if len(parts) < 2 or parts[0] not in ("ip4", "ip6"):
        return None
    try:
        ip = ipaddress.ip_address(parts[1])
    except ValueError:
        return None
    if not ip.is_global:
        return None
    prefix = IPV4_PREFIX if ip.version == 4 else IPV6_PREFIX
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


def cap_per_network(peers: Sequence, limit: int, seen_at: Mapping[str, Sequence[str]],
                    first_seen: Mapping[str, float]) -> tuple[list, list]:
    """(kept, skipped): `peers` (anything with a `peer_id`, in their order) with at most `limit` per network.

    `seen_at[peer_id]`: the addresses of this node's live connections to that peer; a peer's network is the
    lowest network among them (None: not counted). Over the limit, the earliest `first_seen` stay, then the
    lowest peer ids. `limit` <= 0: no cap."""
    if limit <= 0:
        return list(peers), []
    by_network: dict[str, list] = {}
    for p in peers:
        networks = sorted({n for n in map(network_of, seen_at.get(p.peer_id, ())) if n is not None})
        if networks:
            by_network.setdefault(networks[0], []).append(p)
    skipped: set[str] = set()
    for members in by_network.values():
        if len(members) > limit:
            members.sort(key=lambda p: (first_seen.get(p.peer_id, float("inf")), p.peer_id))
            skipped.update(p.peer_id for p in members[limit:])
    return [p for p in peers if p.peer_id not in skipped], [p for p in peers if p.peer_id in skipped]
