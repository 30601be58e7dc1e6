"""The coordinator: the swarm's bootstrap DHT node and the holder of its signing key.

It names the run: it stamps its public key and the hash of the shared constants into the
run spec, signs it, and keeps it published in the DHT (re-stored well before it expires),
so peers that join can verify what they are training and who decided it.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from peer.data.run_corpus import run_batches, with_corpus
from peer.data.run_tokenizer import run_tokenizer_sha256
from peer.data.run_tokens import check_data_flags, token_batches, with_tokens
from protocol.model import spec_basis
from protocol.snapshot_wire import CHUNK_BYTES
from protocol.spec import RunSpec
from protocol.wire import KIND_DATA_REPORT, KIND_SNAPSHOT, KIND_STATS, KIND_WORK
from swarm.basis import BasisRefitter
from swarm.data.tokenizer_fetch import share_run_tokenizer
from swarm.dht import SwarmDHT, close_node, start_dht
from swarm.monitor.liveness import LivenessProbe
from swarm.net import Transport
from swarm.net.addresses import LOOPBACK, PRIVATE, PUBLIC, announce_addresses, scope_of
from swarm.net.reachability import DialBack
from swarm.options import opt
from swarm.replicas.checkpoint_keeper import CheckpointKeeper
from swarm.replicas.data_check import DataVerdict, tell_to_read_lease
from swarm.replicas.leases import LeaseKeeper
from swarm.replicas.vouched import SnapshotVouch
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity, IdentityError
from swarm.trust.keys import SigningKey
from swarm.trust.state_dir import WHERE, default_file
from swarm.trust.work import MAX_BITS

DEFAULT_WORK_BITS = 22  # 2^22 hashes: ~2.5 CPU-s at the 1.7 M sha256/s one core of the dev machine does in Python

log = logging.getLogger(__name__)

_REACH_NOTE = {PUBLIC: "", PRIVATE: "   (from this network only)", LOOPBACK: "   (from this machine only)"}


@dataclass
class CoordinatorOptions:
    """What `swarm coordinator` can be told besides the run spec; each field is also its flag."""

    spec: RunSpec
    host_maddrs: list[str] = opt(["/ip4/0.0.0.0/tcp/0"], "libp2p listen addresses (default: all interfaces, "
                                 "random port)", metavar="MADDR")
    identity: str | None = opt(None, "libp2p identity file: its peer id, and so the address peers join with, "
                               "stays the same across restarts; created (mode 0600) if missing (default: "
                               "coordinator.id in the state folder; a FILE you name is used as given, relative to "
                               "the current folder)", metavar="FILE")
    public_ip: str | None = opt(None, "your router's public IP, with the TCP port of --host-maddrs forwarded to "
                                "this machine: announces /ip4/IP/tcp/PORT", metavar="IP")
    announce_maddrs: list[str] = opt([], "announce exactly these addresses", metavar="MADDR")
    key: str | None = opt(None, "swarm signing key file: whoever holds it decides the run; created (mode 0600) if "
                          "missing (default: swarm.key in the state folder, so a restarted coordinator keeps its "
                          "swarm; a FILE you name is used as given, relative to the current folder)", metavar="FILE")
    state_dir: str | None = opt(None, f"the state folder, where the default identity and key live (default: "
                                f"{WHERE}; created mode 0700)", metavar="DIR")
    data: str | None = opt(None, "the text file or folder this run trains on: its path and sha256 go into the run "
                           "spec, so that heads started without --data read it, a head with other text refuses "
                           "to start, and `swarm eval` scores it (default: the embedded corpus)", metavar="PATH")
    data_binary_ok: bool = opt(False, "use --data even where its files are not text (not UTF-8); without it such "
                               "files are refused with their names")
    tokens: str | None = opt(None, "a folder made by `swarm data prepare` this run trains on instead of --data: its "
                             "path, manifest and tokenizer sha256 go into the run spec and the spec's vocab becomes "
                             "the tokenizer's, so that heads started without --tokens read it, a head with other "
                             "tokens refuses to start, and `swarm eval` scores it", metavar="DIR")
    maddrs_file: str | None = opt(None, "write the coordinator's addresses here as JSON", metavar="FILE")
    private: bool = opt(False, "admit only peers with a ticket signed by the swarm key (`swarm admit`)")
    id_work_bits: int = opt(DEFAULT_WORK_BITS, "every peer id must prove 2^N sha256 hashes of work for this run before "
                            "its announcements count (computed once per identity and run, kept beside --identity; "
                            f"{DEFAULT_WORK_BITS}: about 2.5 CPU-seconds on average, measured at 1.7 M hashes/s per "
                            "core; each bit doubles it; 0: none, for LAN swarms; `swarm local` uses 0)",
                            metavar="N")
    ids_per_network: int = opt(4, "readers count at most this many peer ids per stage from one IPv4 /24 or IPv6 /48, "
                               "as seen on their connections (loopback and private addresses exempt; 0: no cap); "
                               "raise it when many volunteers share one public address", metavar="N")
    ids_per_block: int = opt(16, "readers also count at most this many peer ids per stage from one IPv4 /16 or IPv6 "
                             "/32 (the size of one ISP's or hoster's allocation: 65,536 /48s), so that an attacker "
                             "with many cheap /48s or /24s of one provider fields M ids per stage, not 4 per /48 "
                             "(0: no cap); raise it when many volunteers of one ISP serve one stage", metavar="M")
    snapshot_every: int = opt(50, "every stage snapshots its state every this many steps, and peers of other stages "
                              "keep the snapshots, so that a stage whose every replica left is restored, not reset "
                              "(0: never)")
    compile: bool = opt(False, "every peer torch.compiles each transformer block of its stage (fused norms, RoPE, "
                        "SwiGLU and residual adds): 1.36x the tokens/s of a 2-stage `large` bf16 swarm on one H100, "
                        "after ~12 s of compiling. A run-wide choice: a compiled stage's gradients differ from an "
                        "eager one's by more than the spot checks allow in bf16 (2.8%% against 2%%, measured), so "
                        "every replica must compute alike")
    checkpoint_dir: str | None = opt(None, "keep every stage's newest snapshots that the swarm key vouched for here "
                                     "(fetched from the peers in chunks, checked against the vouched sha256) and "
                                     "give them to a peer that restores a stage no live peer holds a snapshot of",
                                     metavar="DIR")
    unchecked_powersgd: bool = opt(False, "run --replica-sync powersgd in a public swarm although nobody can check a "
                                   "replica's powersgd factors (each carries its own error feedback, so no one can "
                                   "recompute them): a liar's x-50 contribution is taken. Without this flag such a run "
                                   "must be --private; pass it only where you trust every peer")
    trusted_heads: list[str] = opt([], "only these heads (peer ids, in this order) may lead; the coordinator's lease "
                                   "names them (default: every head, in the order the coordinator first saw them, so "
                                   "a head that joins later never leads while an earlier one lives)",
                                   metavar="PEER_ID")
    ttl: float = 60.0

    def check(self) -> None:
        """ValueError (one sentence) for a setting that cannot work."""
        if not 0 <= self.id_work_bits <= MAX_BITS:
            raise ValueError(f"--id-work-bits must be between 0 (no proof of work) and {MAX_BITS}.")
        if self.ids_per_network < 0:
            raise ValueError("--ids-per-network must be 0 (no cap) or a positive number of peer ids.")
        if self.ids_per_block < 0:
            raise ValueError("--ids-per-block must be 0 (no cap) or a positive number of peer ids.")
        check_data_flags(self.data, self.tokens)
        if self.spec.replica_sync == "powersgd" and not (self.private or self.unchecked_powersgd):
            raise ValueError("--replica-sync powersgd leaves every replica's contribution unchecked (no one can "
                             "recompute its factors), so a public swarm refuses it: add --private and admit your peers "
                             "with `swarm admit`, or pass --unchecked-powersgd if you trust every peer, or use "
                             "--replica-sync exact.")


def sealed_spec(spec: RunSpec, key: SigningKey, peer_id: str = "", private: bool = False,
                snapshot_every: int = 0, id_work_bits: int = 0, ids_per_network: int = 0,
                compile_blocks: bool = False, ids_per_block: int = 0) -> RunSpec:
    """The spec as the swarm sees it: with the coordinator's key, its peer id (where stages send
    their re-fit statistics), the shared-constant hash, whether only ticket holders may join,
    every how many steps all stages snapshot (so that they snapshot at the same steps), and what
    a peer id costs (`id_work_bits`, `ids_per_network`, `ids_per_block`: absent when 0, as older coordinators
    wrote it)."""
    extra = dict(spec.extra)
    if id_work_bits:
        extra["id_work_bits"] = id_work_bits
    if ids_per_network:
        extra["ids_per_network"] = ids_per_network
    if ids_per_block:
        extra["ids_per_block"] = ids_per_block
    if snapshot_every:
        extra["snapshot_every"] = snapshot_every
    if compile_blocks:  # every replica alike: spot checks compare a compiled share with its recomputation
        extra["compile_blocks"] = True
    if peer_id:
        extra["coordinator_peer"] = peer_id
    if private:
        extra["private"] = True
    basis = spec_basis(spec)
    if basis is not None:
        extra["basis_hash"] = basis.hash()
    return spec.replace(coordinator_key=key.public_bytes().hex(), extra=extra)


async def run_coordinator(opts: CoordinatorOptions,
                          on_refitter: Callable[[BasisRefitter], None] | None = None) -> int:
    """Run the coordinator until it is cancelled; returns an exit code. `on_refitter` is an extension point
    for code that embeds a coordinator: it is called with the basis re-fitter once it is built, before it
    serves (e.g. a test wraps it to play a slow coordinator)."""
    opts.check()  # before any file or daemon
    key_file = opts.key or default_file("swarm.key", opts.state_dir)
    identity_file = opts.identity or default_file("coordinator.id", opts.state_dir)
    # reads the corpus or token folder: a bad --data or --tokens fails before any daemon starts
    spec = with_tokens(with_corpus(opts.spec, opts.data), opts.tokens)
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


async def _coordinate(opts: CoordinatorOptions, spec: RunSpec, key: SigningKey, key_file: str,
                      identity: Identity, on_refitter: Callable[[BasisRefitter], None] | None) -> int:
    # in force before any record: the coordinator's own node refuses unproven ids from the start
    policy = AdmissionPolicy(opts.private, key.public_bytes(), identity.peer_id, opts.id_work_bits)
    announce = announce_addresses(opts.host_maddrs, opts.public_ip, opts.announce_maddrs)
    dht = await asyncio.to_thread(start_dht, [], opts.host_maddrs, identity, False, policy,
                                  **({"announce_maddrs": announce} if announce else {}))
    p2p = transport = refitter = leases = snapshots = None
    try:
        p2p = await dht.replicate_p2p()
        spec = sealed_spec(spec, key, identity.peer_id, opts.private, opts.snapshot_every, opts.id_work_bits,
                           opts.ids_per_network, opts.compile, opts.ids_per_block)
        sdht = SwarmDHT(dht, identity, swarm_key=key, policy=policy)
        frame = max(spec.d_model * spec.rank * 4, CHUNK_BYTES if opts.checkpoint_dir else 0) + (1 << 16)
        transport = Transport(p2p, f"subspace-swarm-{spec.run_hash}", max_frame_bytes=frame)
        # a killed replica's record outlives it: only replicas that answer vote in a re-fit
        keeper = LeaseKeeper(sdht, spec.run_hash, LivenessProbe(p2p).checker(spec.run_hash, transport),
                             trusted=opts.trusted_heads)
        refitter = BasisRefitter(spec, key, sdht, transport, opts.ttl * 100,
                                 answers=LivenessProbe(p2p).checker(spec.run_hash, transport),
                                 leaders=lambda: keeper.lease.order if keeper.lease is not None else [])
        vouch = SnapshotVouch(sdht, spec.run_hash, spec.n_stages)
        async def on_record(record) -> None:  # a lease head's signed work record: its hashes, and who worked
            keeper.note_work(record)
            await vouch.on_record(record)
        refitter.on_record = on_record
        if on_refitter is not None:
            on_refitter(refitter)
        if opts.checkpoint_dir:  # the coordinator holds every stage's vouched snapshots too (issue 19)
            async def holders(stage: int) -> list[str]:  # the stage's own replicas first, then its custodians
                found = await sdht.all_stage_peers(spec.run_hash, spec.n_stages)
                return list(dict.fromkeys(a.peer_id for s in [stage] + [t for t in found if t != stage]
                                          for a in found.get(s, [])))
            snapshots = CheckpointKeeper(spec, transport, holders, opts.checkpoint_dir)
            vouch.on_vouched = snapshots.on_vouched
            await transport.serve(KIND_SNAPSHOT, snapshots.on_request)
        if spec.refits_basis:
            await transport.serve(KIND_STATS, refitter.on_stats)
        await transport.serve(KIND_WORK, refitter.on_work)  # who may vote in each re-fit; which snapshots are sound
        await DialBack().serve(transport)  # joining peers ask whether they can be reached
        if await share_run_tokenizer(spec, transport, sdht, opts.tokens, fetch=False) is None \
                and run_tokenizer_sha256(spec) is not None:  # heads whose folder lacks it fetch it from us
            log.warning("the token folder holds no tokenizer.json: peers that lack the run's tokenizer cannot get it "
                        "here (run the same `swarm data prepare` again to add it)")
        await sdht.publish_run_spec(spec.to_json(), key, opts.ttl)
        async def everyone_reads(_lease) -> None:  # after a revocation: every peer reads the new lease now
            peers = [a.peer_id for anns in (await sdht.all_stage_peers(spec.run_hash, spec.n_stages)).values()
                     for a in anns]
            await tell_to_read_lease(transport, spec.run_hash, peers)
        keeper.on_revoke = everyone_reads
        async def revoke(head: str, why: str, to: int | None, caught: int) -> bool:
            if to is not None:  # the undone steps' vouched snapshots and states go: they are driven again
                await vouch.forget_after(to)
            return await keeper.revoke(head, why, to, caught)
        async def heads() -> set[str]:  # a head that joined a moment ago is not in the lease yet
            return {a.peer_id for a in await sdht.stage_peers(spec.run_hash, 0)} | set(keeper.lease.order
                                                                                     if keeper.lease else [])
        verdict = DataVerdict(spec.run_hash, spec.n_microbatches, lambda: token_batches(spec, opts.tokens)
                              or run_batches(spec, opts.data), revoke,
                              lambda head, caught: vouch.before(head, caught, keeper.revoked),
                              heads=heads)
        await transport.serve(KIND_DATA_REPORT, verdict.on_report)  # heads report leaders that fed other data
        leases = asyncio.create_task(keeper.run())  # which heads may lead, signed by the swarm key
        maddrs = [str(m) for m in dht.get_visible_maddrs()]
        if opts.maddrs_file:
            with open(opts.maddrs_file, "w") as f:
                json.dump({"maddrs": maddrs, "run": spec.run_hash, "key": key.fingerprint()}, f)
        log.info("coordinator of %s run %s (%s), key %s (public key %s)", "private" if opts.private else "public",
                 spec.run_hash, spec.name, key.fingerprint(), key.public_bytes().hex())
        if opts.private:
            log.info("admit a peer with: swarm admit --key %s --peer-id PEER_ID", key_file)
        for m in sorted(maddrs, key=scope_of, reverse=True):  # public first: those work from anywhere
            log.info("peers join with: swarm peer --initial-peers %s%s", m, _REACH_NOTE[scope_of(m)])
        while True:
            await asyncio.sleep(opts.ttl / 3)
            try:
                await sdht.publish_run_spec(spec.to_json(), key, opts.ttl)
                await refitter.republish()
                await vouch.republish()
            except Exception as e:  # keep coordinating; the next round retries
                log.warning("could not re-publish the run spec: %s", e)
    finally:
        if leases is not None:
            leases.cancel()
            await asyncio.gather(leases, return_exceptions=True)
        if refitter is not None:
            refitter.stop()
        if snapshots is not None:
            await snapshots.stop()
        await close_node(dht, p2p, transport)
