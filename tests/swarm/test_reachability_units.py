"""Addresses a peer announces, the relay options, the router's relay penalty, the dial-back
request rules and the stage remembered beside an identity file (no network here; the real
dial-back and relays run in tests/swarm/test_dialback.py and tests/e2e/test_netns_swarm.py)."""
from __future__ import annotations

import asyncio

import msgpack
import pytest
from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

from swarm.dht import StageAnnouncement
from swarm.monitor.health import reachability_of
from swarm.monitor.status import format_table
from swarm.net.addresses import (
    LOOPBACK,
    PRIVATE,
    PUBLIC,
    AddressError,
    announce_addresses,
    daemon_maddr,
    scope_of,
    swarm_scope,
    usable,
    without_peer,
)
from swarm.net.reachability import RELAY_PENALTY, DialBack, dht_options, relay_penalty, restarted
from swarm.net.relay import circuit_addresses, relay_options
from swarm.stage_memory import recall_stage, remember_stage, stage_file

PEER = "12D3KooWRWShW3JVYuUsmoRJn3PPkXtmR76LtFSDGB4e8dqkV8am"
RELAY = f"/ip4/8.8.4.4/tcp/31337/p2p/{PEER}"


def test_scopes():
    assert scope_of("/ip4/127.0.0.1/tcp/1") == LOOPBACK and scope_of("/ip6/::1/tcp/1") == LOOPBACK
    assert scope_of("/ip4/0.0.0.0/tcp/1") == LOOPBACK
    for private in ("/ip4/10.1.2.3/tcp/1", "/ip4/192.168.1.5/tcp/1", "/ip4/172.16.0.9/tcp/1", "/ip4/100.64.0.1/tcp/1"):
        assert scope_of(private) == PRIVATE, private
    assert scope_of("/ip4/8.8.8.8/tcp/1") == PUBLIC and scope_of("/dns4/swarm.example.org/tcp/1") == PUBLIC
    assert scope_of(f"{RELAY}/p2p-circuit/p2p/{PEER}") == PUBLIC  # a circuit is as reachable as its relay
    assert swarm_scope(["/ip4/127.0.0.1/tcp/1/p2p/x"]) == LOOPBACK
    assert swarm_scope(["/ip4/127.0.0.1/tcp/1", "/ip4/10.0.0.1/tcp/1"]) == PRIVATE
    assert swarm_scope([]) == PUBLIC


def test_usable_addresses_depend_on_where_the_swarm_is():
    mine = ["/ip4/127.0.0.1/tcp/5/p2p/x", "/ip4/192.168.1.5/tcp/5/p2p/x", "/ip4/8.8.8.8/tcp/5/p2p/x"]
    assert usable(mine, LOOPBACK) == mine
    assert usable(mine, PRIVATE) == mine[1:]
    assert usable(mine, PUBLIC) == mine[2:]
    assert usable(mine[:2], PUBLIC) == []  # a home machine in a public swarm: nothing to announce, so relayed


def test_announce_addresses_from_flags():
    assert announce_addresses(["/ip4/0.0.0.0/tcp/0"]) == []
    assert announce_addresses(["/ip4/0.0.0.0/tcp/31337"], "8.8.8.8") == ["/ip4/8.8.8.8/tcp/31337"]
    assert announce_addresses(["/ip4/0.0.0.0/tcp/31337"], "2001:4860::8888") == ["/ip6/2001:4860::8888/tcp/31337"]
    assert announce_addresses([], None, ["/ip4/8.8.8.8/tcp/4001"]) == ["/ip4/8.8.8.8/tcp/4001"]
    with pytest.raises(AddressError, match="needs a fixed listen port"):
        announce_addresses(["/ip4/0.0.0.0/tcp/0"], "8.8.8.8")
    with pytest.raises(AddressError, match="not an IP address"):
        announce_addresses(["/ip4/0.0.0.0/tcp/31337"], "my-router")
    with pytest.raises(AddressError, match="port 0"):
        announce_addresses([], None, ["/ip4/8.8.8.8/tcp/0"])
    with pytest.raises(AddressError, match="not a multiaddr"):
        announce_addresses([], None, ["8.8.8.8:4001"])


def test_daemon_maddr_writes_peer_ids_as_multihashes():
    from hivemind.p2p import PeerID
    circuit = f"{RELAY}/p2p-circuit"
    raw = daemon_maddr(circuit).to_bytes()
    digest = PeerID.from_base58(PEER).to_bytes()
    assert b"\xa5\x03" + bytes([len(digest)]) + digest in raw  # /p2p/ then the raw multihash, no CID prefix
    assert raw.endswith(b"\xa2\x02")  # /p2p-circuit
    assert str(daemon_maddr(circuit)) == circuit
    assert without_peer(f"/ip4/1.2.3.4/tcp/5/p2p/{PEER}") == "/ip4/1.2.3.4/tcp/5"
    assert without_peer(f"{RELAY}/p2p-circuit/p2p/{PEER}") == f"{RELAY}/p2p-circuit"


def test_relay_options_use_the_initial_peers_as_static_relays():
    options = relay_options([RELAY, "/ip4/127.0.0.1/tcp/31337/p2p/" + PEER])
    assert options["use_auto_relay"] and options["use_relay"] and options["force_reachability"] == "private"
    assert options["trusted_relays"] == [RELAY]  # the loopback address means nothing to a public swarm
    assert options["announce_maddrs"] == [f"{RELAY}/p2p-circuit"] == circuit_addresses([RELAY])
    from hivemind.p2p import P2P
    args = P2P._make_process_args("p2pd", autoRelay=True, trustedRelays=RELAY)
    assert "-relayDiscovery=0" in args  # p2pd then reserves at once instead of after three minutes
    assert not any("relayDiscovery" in a for a in P2P._make_process_args("p2pd", autoRelay=False))
    with pytest.raises(ValueError, match="needs an initial peer"):
        relay_options(["/ip4/8.8.8.8/tcp/31337"])


def test_dht_options_per_mode():
    assert dht_options("auto", [RELAY], ["/ip4/0.0.0.0/tcp/0"]) == {}
    assert dht_options("direct", [RELAY], ["/ip4/0.0.0.0/tcp/31337"], "8.8.8.8") == {
        "announce_maddrs": ["/ip4/8.8.8.8/tcp/31337"]}
    relayed = dht_options("relayed", [RELAY], ["/ip4/0.0.0.0/tcp/0"])
    assert relayed["client_mode"] and relayed["announce_maddrs"] == [f"{RELAY}/p2p-circuit"]
    with pytest.raises(ValueError, match="drop --public-ip"):
        dht_options("relayed", [RELAY], ["/ip4/0.0.0.0/tcp/31337"], "8.8.8.8")


def announcement(maddrs: list[str]) -> StageAnnouncement:
    return StageAnnouncement(PEER, "ab" * 8, 1, maddrs, 1000.0, 0, 0, "online", "0.1.0")


def test_relay_penalty_and_reachability_of_announcements():
    relayed = announcement([f"{RELAY}/p2p-circuit/p2p/{PEER}"])
    direct = announcement([f"/ip4/8.8.8.8/tcp/5/p2p/{PEER}"])
    assert relay_penalty(relayed) == RELAY_PENALTY < 1.0
    assert relay_penalty(direct) == 1.0 and relay_penalty(announcement([])) == 1.0
    assert reachability_of(relayed.maddrs) == "relayed" and reachability_of(direct.maddrs) == "direct"


def test_status_table_shows_reachability():
    state = {"run": {"hash": "ab" * 8, "name": "tiny", "codec": "subspace", "rank": 16, "stages": 2, "key": "k"},
             "stages": {0: [{"peer": "A" * 20, "state": "online", "throughput": 10.0, "queue": 0, "basis_version": 0,
                             "age_s": 1.0, "reachability": "direct", "answers": True}],
                        1: [{"peer": "B" * 20, "state": "online", "throughput": 5.0, "queue": 1, "basis_version": 0,
                             "age_s": 2.0, "reachability": "relayed", "answers": True}]}}
    lines = format_table(state).splitlines()
    assert "reach" in lines[1]
    assert "direct" in lines[2] and "relayed" in lines[3] and "B" * 10 in lines[3]


async def test_dialback_refuses_requests_it_should_not_serve():
    handler = DialBack()
    for body in ({"maddrs": []}, {"maddrs": ["/ip4/8.8.8.8/udp/5"]}, {"maddrs": ["/ip4/8.8.8.8/tcp/5"] * 9},
                 {"maddrs": "x"}, ["/ip4/8.8.8.8/tcp/5"]):
        with pytest.raises(ValueError, match="names 1 to 8 TCP or relay addresses"):
            await handler.handle(msgpack.packb(body), PEER)


def test_stage_is_remembered_beside_the_identity(tmp_path):
    identity = str(tmp_path / "peer.id")
    assert recall_stage(identity, "run1") is None and recall_stage(None, "run1") is None
    remember_stage(identity, "run1", 2)
    remember_stage(identity, "run2", 0)
    assert recall_stage(identity, "run1") == 2 and recall_stage(identity, "run2") == 0
    stage_file(identity).write_text("{not json")
    assert recall_stage(identity, "run1") is None  # a damaged file is forgotten, never fatal
    remember_stage(None, "run1", 1)  # no identity: nothing to remember, nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["peer.id.stages.json"]


def _flaky_restart(errors):
    """A restart that raises `errors` in turn, then returns the options it was given; and the calls it saw."""
    calls = []

    def restart(options):
        calls.append(options)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return options
    return restart, calls


def test_a_relay_restart_that_cannot_reach_the_bootstrap_peers_yet_is_started_again():
    """Seen under load (tests/e2e/test_netns_swarm.py): the restarted p2pd failed to connect to the bootstrap
    peers, which had just seen this peer id leave; a second start succeeds."""
    restart, calls = _flaky_restart([P2PDaemonError("failed to connect to bootstrap peers")] * 2)
    assert asyncio.run(restarted(restart, {"client_mode": True}, timeout=30)) == {"client_mode": True}
    assert len(calls) == 3


def test_a_relay_restart_gives_up_on_other_errors_at_once_and_on_bootstrap_errors_after_its_deadline():
    restart, calls = _flaky_restart([P2PDaemonError("address already in use")])
    with pytest.raises(P2PDaemonError, match="in use"):
        asyncio.run(restarted(restart, {}, timeout=30))
    assert len(calls) == 1
    restart, calls = _flaky_restart([P2PDaemonError("failed to connect to bootstrap peers")] * 50)
    with pytest.raises(P2PDaemonError, match="bootstrap"):
        asyncio.run(restarted(restart, {}, timeout=1.5))
    assert 2 <= len(calls) <= 4  # one start a second until the deadline has passed
