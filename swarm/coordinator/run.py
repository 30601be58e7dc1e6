"""`run_coordinator`: one coordinator process, from its node to its duties.

It names the run: it stamps its public key and the hash of the shared constants into the run spec
(`options.sealed_spec`), signs it and keeps it published, so that peers that join can verify what they
train and who decided it. With standbys (`--standby`, the same key, on other machines), the one that holds
the seat (`seat.py`) does the duties (`duties.py`); the others stand by and take over when it dies or
pauses. A standby reads the run spec from the swarm instead of building it from flags.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable

from peer.data.run_corpus import with_corpus
from peer.data.run_tokenizer import run_tokenizer_sha256
from peer.data.run_tokens import with_tokens
from protocol.snapshot_wire import CHUNK_BYTES
from protocol.spec import RunSpec
from swarm.basis import BasisRefitter
from swarm.data.tokenizer_fetch import share_run_tokenizer
from swarm.dht import SwarmDHT, close_node, set_policy, start_dht
from swarm.dht.record_service import share_records, spec_asker
from swarm.dht.spec_fetch import fetch_spec
from swarm.net import Transport
from swarm.net.addresses import LOOPBACK, PRIVATE, PUBLIC, announce_addresses, scope_of
from swarm.net.reachability import DialBack
from swarm.trust.admission import AdmissionPolicy, Ticket
from swarm.trust.identity import Identity, IdentityError
from swarm.trust.keys import SigningKey
from swarm.trust.state_dir import default_file

from .duties import CoordinatorDuties
from .options import CoordinatorOptions, sealed_spec
from .seat import CoordinatorSeat

log = logging.getLogger(__name__)

_REACH_NOTE = {PUBLIC: "", PRIVATE: "   (from this network only)", LOOPBACK: "   (from this machine only)"}
STANDBY_SPEC_S = 120.0  # how long a standby waits for the active coordinator's run spec to reach it


async def run_coordinator(opts: CoordinatorOptions,
                          on_refitter: Callable[[BasisRefitter], None] | None = None) -> int:
    """Run the coordinator until it is cancelled; returns an exit code. `on_refitter` is an extension point
    for code that embeds a coordinator: it is called with the basis re-fitter each time one is built, before
    it serves (e.g. a test wraps it to play a slow coordinator)."""
    opts.check()  # before any file or daemon
    key_file = opts.key or default_file("swarm.key", opts.state_dir)
    identity_file = opts.identity or default_file("coordinator.id", opts.state_dir)
    if opts.standby and not os.path.exists(key_file):
        raise ValueError(f"a standby signs with the swarm's key and {key_file} does not exist: copy the active "
                         f"coordinator's key file here and pass it with --key FILE.")
    # reads the corpus or token folder: a bad --data or --tokens fails before any daemon starts
    spec = None if opts.standby else with_tokens(with_corpus(opts.spec, opts.data), opts.tokens)
    key = SigningKey.load_or_create(key_file)
    identity = Identity.load_or_create(identity_file)
    try:  # two coordinators with one peer id would be one node to the swarm
        lock = Identity.lock(identity_file)
    except IdentityError:
        raise IdentityError(f"another running coordinator uses the identity {identity_file}; give this one its "
                            f"own --identity FILE or --state-dir DIR.") from None
    try:
        log.info("swarm key %s, identity %s (peer id %s)", key_file, identity_file, identity.peer_id)
        return await _coordinate(opts, spec, key, key_file, identity, on_refitter)
    finally:
        os.close(lock)


async def _coordinate(opts: CoordinatorOptions, spec: RunSpec | None, key: SigningKey, key_file: str,
                      identity: Identity, on_refitter: Callable[[BasisRefitter], None] | None) -> int:
    # in force before any record: the coordinator's own node refuses unproven ids from the start
    policy = AdmissionPolicy(opts.private, key.public_bytes(), identity.peer_id, opts.id_work_bits)
    announce = announce_addresses(opts.host_maddrs, opts.public_ip, opts.announce_maddrs)
    dht = await asyncio.to_thread(start_dht, opts.initial_peers, opts.host_maddrs, identity, False, policy,
                                  **({"announce_maddrs": announce} if announce else {}))
    p2p = transport = records = duties = seat = None
    try:
        p2p = await dht.replicate_p2p()
        sdht = SwarmDHT(dht, identity, swarm_key=key, policy=policy)
        if spec is None:  # a standby: the run is the one its swarm's active coordinator signed with this key
            # a private swarm's peers re-serve the spec to ticket holders only, and a standby is admitted by its
            # claim, which it makes once it has the spec: so it asks with a ticket it signs for itself
            own = Ticket.issue(key, identity.peer_id, time.time() + STANDBY_SPEC_S + 60)
            asker, asking = await spec_asker(dht, opts.initial_peers, own.to_bytes())
            try:  # every coordinator down for longer than the spec lives in the DHT: a peer's copy
                spec = await fetch_spec(sdht, key.public_bytes().hex(), STANDBY_SPEC_S, asker)
            finally:
                await asking.close()
            policy = AdmissionPolicy.for_spec(spec)  # private or not, and its work bits, are the spec's
            sdht.admission.adopt(policy)
            await set_policy(dht, policy)
        else:
            spec = sealed_spec(spec, key, identity.peer_id, opts.private, opts.snapshot_every, opts.id_work_bits,
                               opts.ids_per_network, opts.compile, opts.ids_per_block)
        frame = max(spec.d_model * spec.rank * 4, CHUNK_BYTES if opts.checkpoint_dir else 0) + (1 << 16)
        transport = Transport(p2p, f"subspace-swarm-{spec.run_hash}", max_frame_bytes=frame)
        # what the DHT lost while no coordinator was up (the basis chain, the lease) is resumed from the peers
        records = await share_records(p2p, sdht, spec, opts.initial_peers, identity.peer_id)
        duties = CoordinatorDuties(opts, spec, key, sdht, transport, p2p, on_refitter)
        await duties.serve()
        await DialBack().serve(transport)  # joining peers ask whether they can be reached
        if await share_run_tokenizer(spec, transport, sdht, opts.tokens, fetch=False) is None \
                and run_tokenizer_sha256(spec) is not None:  # heads whose folder lacks it fetch it from us
            log.warning("the token folder holds no tokenizer.json: peers that lack the run's tokenizer cannot get it "
                        "here (run the same `swarm data prepare` again to add it)")
        maddrs = [str(m) for m in dht.get_visible_maddrs()]

        def write(path: str | None) -> None:
            if path:
                with open(path, "w") as f:
                    json.dump({"maddrs": maddrs, "run": spec.run_hash, "key": key.fingerprint()}, f)

        def serving() -> None:  # the addresses file says "it serves": the run spec is there to read from then
            write(opts.maddrs_file)
        write(opts.listening_file)  # peers may start now: they join through this node and wait for the spec
        said_serving = opts.standby
        if opts.standby:  # a standby serves as a node to join through at once
            serving()
        log.info("coordinator%s of %s run %s (%s), key %s (public key %s)", " (standby)" if opts.standby else "",
                 "private" if spec.extra.get("private") else "public", spec.run_hash, spec.name, key.fingerprint(),
                 key.public_bytes().hex())
        if spec.extra.get("private"):
            log.info("admit a peer with: swarm admit --key %s --peer-id PEER_ID", key_file)
        for m in sorted(maddrs, key=scope_of, reverse=True):  # public first: those work from anywhere
            log.info("peers join with: swarm peer --initial-peers %s%s", m, _REACH_NOTE[scope_of(m)])
        seat = CoordinatorSeat(sdht, spec.run_hash, identity.peer_id, lambda: maddrs)
        while True:  # hold the seat and do the duties; stand by while another holds it
            await seat.hold()
            await duties.start()  # publishes the run spec
            if not said_serving:
                said_serving = True
                serving()
            await seat.watch()
            await duties.stop()
    finally:
        if duties is not None:
            await duties.stop()
        if seat is not None:
            await seat.resign()
        if records is not None:
            await records.close()
        await close_node(dht, p2p, transport)
