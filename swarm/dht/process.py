"""Starting and stopping a DHT node (a child process with its own p2pd), leaving nothing behind.

hivemind runs each `DHT` in a child process that owns a `p2pd`; if that process dies the
wrong way its p2pd lives on. Everything here makes sure a node's daemons go with it.

Every node runs with a libp2p identity whose private key Python holds (`swarm/trust/identity.py`),
so that what it writes can be signed by its peer id, and with the swarm's record validator
(`validator.py`), so that it stores and passes on only records their owner wrote.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import time
import warnings
from collections.abc import Sequence

with warnings.catch_warnings():
    # hivemind's import runs torch.jit.script, which warns that it is deprecated; only that.
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.*")
    import hivemind

from swarm.net.addresses import check_initial_peers
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity

from .validator import SwarmRecordValidator, mark_lookups

log = logging.getLogger(__name__)

DEFAULT_HOST_MADDRS = ("/ip4/0.0.0.0/tcp/0",)


def start_dht(
    initial_peers: Sequence[str],
    host_maddrs: Sequence[str] | None = None,
    identity: Identity | str | None = None,
    client_mode: bool = False,
    policy: AdmissionPolicy | None = None,
    **p2p_options,
) -> hivemind.DHT:
    """Start a DHT node (a child process with its own p2pd); blocks until it is ready.

    `identity`: the node's libp2p identity, an identity file's path (created, Ed25519, if
    missing), or None for a fresh one (handed to p2pd through a private temporary file that
    is removed once the node runs). `policy`: who may write records (default: everyone,
    until `SwarmDHT.adopt` reads the run spec). From async code call it through
    `asyncio.to_thread`. Listens on all interfaces unless `host_maddrs` says otherwise,
    because a volunteer's peer must be reachable. `p2p_options` go to hivemind's P2P
    (announce_maddrs, use_auto_relay, ...: `swarm/net/reachability.py`).
    """
    check_initial_peers(initial_peers)  # p2pd would fail with a parser's message, or not at all
    folder = None
    if isinstance(identity, str):
        path, identity = identity, Identity.load_or_create(identity)
    else:
        identity = identity or Identity.generate()
        path, folder = identity.write_private_file()
    try:
        dht = hivemind.DHT(
            initial_peers=list(initial_peers) or None,
            start=True,
            host_maddrs=list(host_maddrs or DEFAULT_HOST_MADDRS),
            identity_path=path,
            client_mode=client_mode,
            record_validators=[SwarmRecordValidator(policy)],
            # hivemind's check that an identity is not in use reads RSA keys only, and starts a
            # second p2pd to do it; a peer id in use twice shows as refused connections instead
            check_if_identity_free=False,
            **p2p_options,
        )
    finally:
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    try:
        if dht.peer_id.to_base58() != identity.peer_id:
            raise RuntimeError(f"p2pd runs as {dht.peer_id} although its identity is {identity.peer_id}; "
                               f"this hivemind/p2pd derives peer ids differently and cannot sign swarm records.")
        mark_lookups(dht)
    except BaseException:
        stop_dht(dht)
        raise
    return dht


def _p2pd_children(parent: int | None) -> list[int]:
    """Pids of p2pd processes whose parent is `parent` (Linux /proc; empty elsewhere)."""
    found = []
    if parent is None or not os.path.isdir("/proc"):
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _p2pd_state(int(entry), parent) is not None:
            found.append(int(entry))
    return found


def _p2pd_state(pid: int, parent: int | None = None) -> str | None:
    """The state letter of a live p2pd with this pid (and parent, if given), else None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
    if comm != "p2pd" or rest[0] in ("Z", "X") or (parent is not None and int(rest[1]) != parent):
        return None
    return rest[0]


async def close_node(dht: hivemind.DHT, p2p=None, transport=None) -> None:
    """Stop what a process built on its DHT, in order: the transport's handlers, the P2P replica
    from `dht.replicate_p2p()`, then the DHT and its p2pd (each may be None if never started)."""
    try:
        if transport is not None:
            await transport.close()
        if p2p is not None:
            await p2p.shutdown()
    finally:
        await asyncio.to_thread(stop_dht, dht)


def stop_dht(dht: hivemind.DHT, grace: float = 5.0) -> None:
    """Shut `dht` down and make sure its p2pd is gone too.

    hivemind's `DHT.shutdown()` asks the DHT process to stop its p2pd, but after a 3 s grace
    it SIGTERMs the DHT process, which then leaves its p2pd orphaned; so we note the p2pd
    first and end it ourselves (TERM, then KILL) if it outlives `grace`. Shut down any P2P
    replica you took with `dht.replicate_p2p()` before calling this. Blocks: from async code
    use `asyncio.to_thread`.
    """
    daemons = _p2pd_children(dht.pid) if dht.is_alive() else []
    dht.shutdown()
    dht.join(grace)  # reap the DHT process, also when shutdown() had to terminate it
    for sig, wait in ((None, grace), (signal.SIGTERM, 2.0), (signal.SIGKILL, 2.0)):
        if sig is not None:
            for pid in daemons:
                if _p2pd_state(pid) is not None:
                    log.warning("p2pd %d outlived its DHT; sending %s", pid, signal.Signals(sig).name)
                    try:
                        os.kill(pid, sig)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + wait
        while (daemons := [p for p in daemons if _p2pd_state(p) is not None]) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not daemons:
            return
