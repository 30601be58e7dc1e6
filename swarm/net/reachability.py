"""Can the swarm dial this peer? A dial-back check at start, and the move to a relay if not.

A peer cannot tell by itself whether others can open connections to it: a home router
(NAT) lets its outgoing connections through and drops incoming ones. So it asks: it sends
one or two other swarm nodes (the coordinator first) a `dialback` request with the
addresses it would announce, and each of them starts a fresh, empty libp2p host (its own
short-lived p2pd: it shares no connection with the asker, so an existing connection cannot
fake success) and tries to connect to the asker's peer id at exactly those addresses.

    verdict = direct    if any helper connected
              relayed   if every helper that answered failed (or there is nothing to announce)
              direct    if no helper answered at all (nothing proves otherwise; logged)

A relayed peer restarts its DHT node behind relays (`relay.py`) and asks again, this time at
its circuit addresses, until a helper gets through (or it gives up with one sentence that
says what to do). A swarm on one machine (loopback) is direct without asking.

Helpers serve `dialback` on the run's transport; a helper only ever dials the peer that
asked (the peer id is the requester's, checked by libp2p's handshake), at most 8 TCP or
circuit addresses, one check at a time (a few more wait; beyond that it refuses).
"""
from __future__ import annotations

import asyncio
import logging
import random
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgpack

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind
    from hivemind.p2p import P2P, PeerID
    from hivemind.p2p.p2p_daemon_bindings.utils import P2PDaemonError

from .addresses import LOOPBACK, announce_addresses, daemon_maddr, is_circuit, swarm_scope, usable, without_peer
from .relay import relay_options
from .transport import Transport, TransportError

if TYPE_CHECKING:
    from protocol.spec import RunSpec

__all__ = ["DIALBACK_KIND", "DialBack", "Reachability", "check_reachability", "dht_options", "relay_penalty",
           "settle_reachability", "RELAY_PENALTY", "ReachabilityError"]

log = logging.getLogger(__name__)

DIALBACK_KIND = "dialback"
MAX_ADDRESSES = 8
MAX_WAITING = 4  # dial-back requests a helper queues; more are refused (the asker asks another helper)
DIAL_TIMEOUT_S = 8.0
RELAY_PENALTY = 0.5  # a relayed peer's announced throughput counts half: two hops, through another peer's uplink


class Announced(Protocol):
    """What this module reads of a peer's announcement (a `swarm.dht.StageAnnouncement`; the DHT builds on
    this room, not the other way round)."""

    peer_id: str
    state: str
    maddrs: list[str]


class StagePeers(Protocol):
    """The one read a dial-back makes of the swarm's DHT (a `swarm.dht.SwarmDHT`): every stage's announced peers."""

    async def all_stage_peers(self, run_hash: str, n_stages: int) -> dict[int, list[Announced]]: ...


class ReachabilityError(RuntimeError):
    """Nobody can reach this peer, not even through a relay; the message says what to do."""


@dataclass(frozen=True)
class Reachability:
    """How others reach this peer ("direct" or "relayed") and the addresses it announces."""

    mode: str
    maddrs: list[str]


def relay_penalty(announcement: Announced) -> float:
    """Multiplier for a peer's throughput when a router ranks it: RELAY_PENALTY if it is only
    reachable through relays (every announced address is a circuit), else 1."""
    maddrs = list(getattr(announcement, "maddrs", []) or [])
    return RELAY_PENALTY if maddrs and all(is_circuit(m) for m in maddrs) else 1.0


def dht_options(mode: str, initial_peers: list[str], host_maddrs: list[str], public_ip: str | None = None,
                announce_maddrs: list[str] = ()) -> dict:
    """Keyword arguments for the first DHT node of a peer (`start_dht`): behind relays if `mode`
    is "relayed", else announcing `--public-ip`/`--announce-maddrs` if given. ValueError on bad flags."""
    if mode == "relayed":
        if public_ip or announce_maddrs:
            raise ValueError("--reachability relayed announces relay addresses only; drop --public-ip and "
                             "--announce-maddrs, or use --reachability direct.")
        return {"client_mode": True, **relay_options(initial_peers)}
    announce = announce_addresses(host_maddrs, public_ip, announce_maddrs)
    return {"announce_maddrs": announce} if announce else {}


# ---------------------------------------------------------------------- the helper's side
async def probe_dial(peer_id: str, maddrs: list[str], timeout: float = DIAL_TIMEOUT_S) -> tuple[bool, str]:
    """Connect to `peer_id` at `maddrs` from a fresh libp2p host; (connected, why not)."""
    probe = await P2P.create(use_relay=any(is_circuit(m) for m in maddrs), use_auto_relay=False, no_listen=True,
                             dht_mode="client", auto_nat=False, nat_port_map=False)
    try:
        addrs = [daemon_maddr(without_peer(m)) for m in maddrs]
        await asyncio.wait_for(probe._client.connect(PeerID.from_base58(peer_id), addrs), timeout)
        return True, ""
    except TimeoutError:
        return False, f"no connection within {timeout:g} s"
    except Exception as e:  # p2pd's ControlFailure: every dial failed
        return False, str(e).splitlines()[0][:200]
    finally:
        await probe.shutdown()


def _dialable(maddr: object) -> bool:
    return isinstance(maddr, str) and len(maddr) <= 512 and ("/tcp/" in maddr or is_circuit(maddr))


class DialBack:
    """The `dialback` handler: try to connect back to whoever asks, at the addresses it names."""

    def __init__(self, timeout: float = DIAL_TIMEOUT_S) -> None:
        self.timeout = timeout
        self._one_at_a_time = asyncio.Semaphore(1)  # each check starts a p2pd: never many at once
        self._waiting = 0

    async def handle(self, body: bytes, peer: str) -> bytes:
        request = msgpack.unpackb(body, raw=False)
        maddrs = request.get("maddrs") if isinstance(request, dict) else None
        if not (isinstance(maddrs, list) and 0 < len(maddrs) <= MAX_ADDRESSES and all(map(_dialable, maddrs))):
            raise ValueError(f"a dial-back request names 1 to {MAX_ADDRESSES} TCP or relay addresses")
        if self._waiting >= MAX_WAITING:
            raise RuntimeError("this helper is busy with other dial-back checks; ask another")
        self._waiting += 1
        try:
            async with self._one_at_a_time:
                reachable, why = await probe_dial(peer, maddrs, self.timeout)
        finally:
            self._waiting -= 1
        log.info("dial-back to %s at %s: %s", peer[-8:], ", ".join(maddrs), "reached" if reachable else why)
        return msgpack.packb({"reachable": reachable, "detail": why})

    async def serve(self, transport: Transport) -> None:
        await transport.serve(DIALBACK_KIND, self.handle)


# ---------------------------------------------------------------------- the asker's side
async def check_reachability(transport: Transport, helpers: list[str], maddrs: list[str],
                             timeout: float = 3 * DIAL_TIMEOUT_S) -> bool | None:
    """True if a helper could connect to us at `maddrs`, False if all that answered could not,
    None if none answered."""
    body = msgpack.packb({"maddrs": maddrs[:MAX_ADDRESSES]})

    async def ask(helper: str) -> bool | None:
        try:
            reply = msgpack.unpackb(await transport.request(helper, DIALBACK_KIND, body, timeout), raw=False)
        except (TransportError, ValueError, TypeError) as e:
            log.debug("helper %s did not check our reachability: %s", helper[-8:], e)
            return None
        if not isinstance(reply, dict) or not isinstance(reply.get("reachable"), bool):
            return None
        if not reply["reachable"]:
            log.info("%s could not connect to this peer at %s (%s)", helper[-8:], ", ".join(maddrs),
                     reply.get("detail"))
        return reply["reachable"]

    answers = [a for a in await asyncio.gather(*(ask(h) for h in helpers)) if a is not None]
    return any(answers) if answers else None


async def pick_helpers(sdht: StagePeers, spec: RunSpec, own_id: str, count: int = 2,
                       coordinators: list[str] | None = None) -> list[str]:
    """The coordinators, then other online peers at random: who is asked to dial back. `coordinators`: the seat's
    holder and the others with live claims (`ActiveCoordinator.peer_ids`, read by the caller: the DHT's records
    build on this room); None: the spec's `coordinator_peer`."""
    out = list(coordinators) if coordinators is not None else (
        [spec.extra["coordinator_peer"]] if spec.extra.get("coordinator_peer") else [])
    try:
        peers = [a.peer_id for anns in (await sdht.all_stage_peers(spec.run_hash, spec.n_stages)).values()
                 for a in anns if a.state == "online" and a.peer_id not in out and a.peer_id != own_id]
    except Exception as e:  # the DHT may not answer yet; the coordinator alone will do
        log.debug("no peers to ask for a dial-back: %s", e)
        peers = []
    random.shuffle(peers)
    return [p for p in out if p != own_id] + peers[: max(0, count - len(out))]


async def settle_reachability(dht: hivemind.DHT, sdht: StagePeers, spec: RunSpec, namespace: str,
                              initial_peers: list[str], mode: str,
                              restart: Callable[[dict], hivemind.DHT], stop: Callable[[hivemind.DHT], None],
                              timeout: float = 30.0, coordinators: list[str] | None = None
                              ) -> tuple[hivemind.DHT, Reachability]:
    """Decide how others reach this peer (`mode`: auto, direct or relayed) and return the DHT node
    to keep with what to announce. If this node cannot be dialed, `stop` ends it and
    `restart(options)` starts the one to keep, behind relays (a new node: wrap it in a new
    SwarmDHT). `coordinators`: who is asked first to dial back (`pick_helpers`)."""
    scope = swarm_scope(initial_peers)
    visible = [str(m) for m in dht.get_visible_maddrs()]
    own_id = dht.peer_id.to_base58()
    if mode == "relayed" or any(is_circuit(m) for m in visible):
        helpers = await pick_helpers(sdht, spec, own_id, coordinators=coordinators)
        return dht, Reachability("relayed", await _confirm_relay(dht, helpers, namespace, scope, timeout))
    direct = Reachability("direct", usable(visible, scope))
    if mode == "direct" or scope == LOOPBACK:
        return dht, direct
    helpers = await pick_helpers(sdht, spec, own_id, coordinators=coordinators)
    if direct.maddrs:
        verdict = await _ask(dht, helpers, namespace, direct.maddrs) if helpers else None
        if verdict is None:
            log.warning("no swarm node answered a dial-back check; assuming others can reach this peer at %s",
                        ", ".join(direct.maddrs))
        if verdict is not False:
            return dht, direct
    log.warning("other peers cannot open connections to this peer (behind NAT or a firewall); serving through a "
                "relay. Forward a port and pass --public-ip for full speed (see README, Troubleshooting).")
    options = {"client_mode": True, **relay_options(initial_peers)}
    await asyncio.to_thread(stop, dht)
    dht = await restarted(restart, options, timeout)
    try:
        return dht, Reachability("relayed", await _confirm_relay(dht, helpers, namespace, scope, timeout))
    except BaseException:  # the caller only knows the node it passed in (stopped by now): stop this one here
        await asyncio.to_thread(stop, dht)
        raise


async def restarted(restart: Callable[[dict], hivemind.DHT], options: dict, timeout: float) -> hivemind.DHT:
    """`restart(options)`, started again (for up to `timeout` s) while its p2pd cannot reach the bootstrap peers:
    they knew this peer id a moment ago, from the node just stopped, and may still be closing that connection."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            return await asyncio.to_thread(restart, options)
        except P2PDaemonError as e:
            if "bootstrap" not in str(e) or loop.time() > deadline:
                raise
            log.warning("the DHT node behind a relay could not reach the bootstrap peers yet (%s); starting it again",
                        e)
        await asyncio.sleep(1.0)


async def _ask(dht: hivemind.DHT, helpers: list[str], namespace: str, maddrs: list[str]) -> bool | None:
    p2p = await dht.replicate_p2p()
    transport = Transport(p2p, namespace, timeout=3 * DIAL_TIMEOUT_S)
    try:
        return await check_reachability(transport, helpers, maddrs)
    finally:
        await transport.close()
        await p2p.shutdown()


async def _confirm_relay(dht: hivemind.DHT, helpers: list[str], namespace: str, scope: int,
                         timeout: float) -> list[str]:
    """Wait until a helper reaches us through a relay circuit; the circuit addresses to announce."""
    circuits = [m for m in usable([str(m) for m in dht.get_visible_maddrs()], scope) if is_circuit(m)]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while circuits:
        verdict = await _ask(dht, helpers, namespace, circuits) if helpers else None
        if verdict is not False:  # reached, or nobody to ask: nothing better to do than to serve
            log.info("serving through relay at %s%s", circuits[0], "" if verdict else " (unconfirmed: nobody to ask)")
            return circuits
        if loop.time() > deadline:
            break
        await asyncio.sleep(1.0)  # the relay reservation may not be in place yet
    raise ReachabilityError("this peer cannot be reached directly and no relay let others reach it; forward a TCP "
                            "port to this machine and pass --host-maddrs /ip4/0.0.0.0/tcp/PORT --public-ip "
                            "YOUR_PUBLIC_IP (see README, Troubleshooting).")
