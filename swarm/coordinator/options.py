"""What `swarm coordinator` can be told (`CoordinatorOptions`, each field also its flag) and the run spec as the
swarm sees it (`sealed_spec`)."""
from __future__ import annotations

from dataclasses import dataclass

from peer.data.run_tokens import check_data_flags
from protocol.model import spec_basis
from protocol.spec import RunSpec
from swarm.options import opt
from swarm.trust.keys import SigningKey
from swarm.trust.state_dir import WHERE
from swarm.trust.work import MAX_BITS

DEFAULT_WORK_BITS = 22  # 2^22 hashes: ~2.5 CPU-s at the 1.7 M sha256/s one core of the dev machine does in Python



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
    maddrs_file: str | None = opt(None, "write the coordinator's addresses here as JSON once it serves the run "
                                  "(holds the seat, the run spec published)", metavar="FILE")
    listening_file: str | None = opt(None, "write the same JSON here as soon as the coordinator's node listens, "
                                     "before it holds the seat (a 2 s settle) and publishes the run spec: a launcher "
                                     "may start peers then, which wait for the spec", metavar="FILE")
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
    standby: bool = opt(False, "stand by for the active coordinator of the swarm that --initial-peers reaches, with "
                        "the same --key: read its run spec from the swarm (the run-spec flags are ignored) and take "
                        "over every duty within ~16 s of its death or pause (leases, vouched hashes, re-fits, "
                        "revocations); run one or more on other machines")
    initial_peers: list[str] = opt([], "address of the active coordinator or any peer of the swarm: where a standby "
                                   "(or a coordinator restarted on another address) joins", metavar="MADDR")
    record_ttl: float | None = opt(None, "a shorter life of this coordinator's records in the DHT: the run spec, "
                                   "basis updates, leader lease and vouched hashes each live S seconds without it "
                                   "(republished every S/3) instead of 60 s, 100 min, 1 h and 1 day, so that what a "
                                   "swarm does once every coordinator has been down longer than its records live "
                                   "shows in minutes (peers re-serve the spec, basis chain and lease they hold: "
                                   "docs/security.md, \"Without any coordinator\")", metavar="S")
    ttl: float = 60.0  # the run spec's life in the DHT (republished every third of it), unless --record-ttl

    def check(self) -> None:
        """ValueError (one sentence) for a setting that cannot work."""
        if not 0 <= self.id_work_bits <= MAX_BITS:
            raise ValueError(f"--id-work-bits must be between 0 (no proof of work) and {MAX_BITS}.")
        if self.ids_per_network < 0:
            raise ValueError("--ids-per-network must be 0 (no cap) or a positive number of peer ids.")
        if self.ids_per_block < 0:
            raise ValueError("--ids-per-block must be 0 (no cap) or a positive number of peer ids.")
        check_data_flags(self.data, self.tokens)
        if self.record_ttl is not None and not 3 <= self.record_ttl <= 3600:
            raise ValueError("--record-ttl must be between 3 and 3600 seconds (a run spec lives at most an hour).")
        if self.standby and not self.initial_peers:
            raise ValueError("--standby needs --initial-peers: the address of the active coordinator or of any peer "
                             "of its swarm.")
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
