"""One peer process, wired together: DHT + libp2p transport + router around its stage.

`run_peer(options)` joins the swarm, reads and verifies the run spec, refuses to join if its
shared constants (U, T_fixed) hash differently from the coordinator's, chooses a stage
(`swarm/replicas/placement.py`) and serves it as one of its replicas (`swarm/replicas/replica.py`): state from
a live replica or a checkpoint, heartbeat, and (as a head) driving the steps. Whatever
happens, it leaves the swarm cleanly: announcement "leaving", handlers removed, p2pd stopped.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from peer.data.batches import BatchSource
from peer.data.corpus import DataError
from peer.data.run_corpus import check_corpus, run_corpus
from peer.data.run_tokens import check_data_flags, run_token_store
from peer.replica.stage_peer import StagePeer
from peer.runner.memory_estimate import parse_size
from protocol.model import spec_basis
from protocol.spec import RunSpec
from protocol.wire import KIND_ACTIVATION, KIND_GRADIENT, KIND_REDUCE
from swarm.data.tokenizer_fetch import share_run_tokenizer
from swarm.dht import ActiveCoordinator, SwarmDHT, close_node, start_dht, stop_dht
from swarm.dht.record_service import share_records, spec_asker
from swarm.dht.spec_fetch import JoinError, fetch_spec
from swarm.monitor.liveness import LivenessProbe
from swarm.monitor.peer_monitor import PeerMonitor
from swarm.net import HomeLink, Transport
from swarm.net.frame_trace import FrameTrace
from swarm.net.message_link import LinkAdapter
from swarm.net.reachability import DialBack, dht_options, settle_reachability
from swarm.optional import require
from swarm.options import opt
from swarm.replicas.membership import PROBE_S
from swarm.replicas.memory_fit import fitting_stages, memory_budget
from swarm.replicas.placement import HOLD_S, PlacementError, choose_stage
from swarm.replicas.replica import ReplicaContext, ReplicaService, transport_limit
from swarm.replicas.router import Router
from swarm.stage_memory import recall_stage, remember_stage
from swarm.trust.admission import AdmissionError, AdmissionPolicy, read_ticket
from swarm.trust.boundary_signer import IdentitySigner
from swarm.trust.identity import Identity, IdentityError
from swarm.trust.work import proof_for

log = logging.getLogger(__name__)


@dataclass
class PeerOptions:
    """Everything `swarm peer` can be told; each field is also its flag (`swarm/options.py`)."""

    initial_peers: list[str] = opt([], "address of the coordinator or any peer of the swarm", metavar="MADDR",
                                   required=True)
    stage: str = opt("auto", "stage to host, or auto (the least covered)")
    device: str = opt("cpu", "torch device, e.g. cuda:0")
    steps: int | None = opt(None, "head only: train until the swarm has done this many steps, counted from the "
                            "start of the run (default: until stopped)")
    linger: bool = opt(False, "head only: after --steps, keep serving (e.g. for `swarm export --initial-peers`) "
                       "until stopped")
    data: str | None = opt(None, "head only: text file or folder; must be the text the run spec records, if it "
                           "records one (default: the recorded corpus, else the embedded one)", metavar="PATH")
    data_binary_ok: bool = opt(False, "use --data even where its files are not text (not UTF-8); without it such "
                               "files are refused with their names")
    tokens: str | None = opt(None, "head only: this machine's copy of the folder made by `swarm data prepare` that "
                             "the run trains on (`swarm coordinator --tokens`); its manifest sha256 must be the one "
                             "the run spec records (default: the recorded path)", metavar="DIR")
    host_maddrs: list[str] = opt(["/ip4/0.0.0.0/tcp/0"], "libp2p listen addresses", metavar="MADDR")
    public_ip: str | None = opt(None, "your router's public IP, with the TCP port of --host-maddrs forwarded to "
                                "this machine: announces /ip4/IP/tcp/PORT", metavar="IP")
    announce_maddrs: list[str] = opt([], "announce exactly these addresses to the swarm", metavar="MADDR")
    reachability: str = opt("auto", "auto: ask other peers to dial back and use a relay if they cannot; direct: "
                            "skip the check; relayed: serve through a relay", choices=("auto", "direct", "relayed"))
    identity: str | None = opt(None, "libp2p identity file for a stable peer id (and stage: remembered in "
                               "FILE.stages.json; and the proof of work a run may ask of a peer id: kept in "
                               "FILE.work.json), created mode 0600 if missing, used as given (default: a new "
                               "identity each start, so several peers on one machine never share one; "
                               "examples/two_machines/peer.sh keeps one in the state folder)", metavar="FILE")
    checkpoint_dir: str | None = opt(None, "save this stage's state here every --checkpoint-every steps and when "
                                     "stopping", metavar="DIR")
    checkpoint_every: int = opt(50, "steps between checkpoints (0: only when stopping)")
    resume: bool = opt(False, "resume from the checkpoint in --checkpoint-dir when no live replica of the stage "
                       "can give its state")
    allow_fresh_stage: bool = opt(False, "if this peer takes a stage that lost every replica and no peer holds a "
                                  "snapshot of it, start the stage again from its initial weights (its training is "
                                  "lost) instead of waiting, the swarm paused, for a peer that holds one to return")
    rebalance_period: float = opt(30.0, "seconds between checks whether moving to another stage would balance the "
                                  "swarm (0: never move)")
    rebalance_hold: float = opt(HOLD_S, "seconds a peer stays at a stage it joined or moved to, unless a stage is "
                                "empty (keeps peers from moving back and forth while others come and go)")
    bandwidth: str | None = opt(None, "emulated home connection: uplink and downlink of this rate, each shared by "
                                "all of this peer's traffic, e.g. 80mbit (benchmarks)")
    latency: str = opt("0", "emulated one-way latency of every frame this peer sends, e.g. 20ms (benchmarks)")
    send_order: str = opt("fifo", "how this peer's activations and gradients share its uplink: fifo, one at a "
                          "time in the order sent, so the next stage can start on the first while the rest "
                          "follow; shared, all at once at a share of the rate each (to compare, in benchmarks)",
                          choices=("fifo", "shared"))
    direct: str = opt("on", "on: frames of 64 KiB and more (activations, gradients, sums, states) go over a plain "
                      "TCP connection to peers that can be dialed, beside libp2p (1.3-2x its rate on fast links: "
                      "docs/benchmarks.md, \"Transport\"), each frame authenticated with a key handed out over "
                      "libp2p (docs/wire.md, \"Direct channel\"); a peer behind a relay only dials out; off: "
                      "everything over libp2p", choices=("on", "off"))
    direct_port: int = opt(0, "TCP port of the direct channel (0: any free port; behind NAT forward it as you do "
                           "the libp2p port, or peers send to you over libp2p)")
    report: str | None = opt(None, "append JSON-lines events (steps, wire counters) here", metavar="FILE")
    trace_frames: str | None = opt(None, "append a timeline of every frame this peer sends and receives here, one "
                                   "JSON line per event (queued, turn, sent, reply, arrived with its downlink wait, "
                                   "answered: swarm/net/frame_trace.py), to see where a step's time goes",
                                   metavar="FILE")
    trusted_key: str | None = opt(None, "only trust a run spec signed by this public key (or its fingerprint)",
                                  flag="--swarm-key", metavar="HEX")
    ticket: str | None = opt(None, "private swarms: this peer's ticket from `swarm admit`, or a file holding it "
                             "(needs the --identity it was made for)", metavar="TICKET")
    threads: int | None = opt(None, "torch intra-op threads")
    join_timeout: float = opt(60.0, "seconds to wait for the run spec")
    step_timeout: float = opt(120.0, "seconds the first step may take before it is re-driven, plus the time its "
                              "boundary bytes take at the swarm's slowest uplink (the run spec's: `swarm "
                              "coordinator --slowest-uplink`); later steps: 4x their measured time")
    min_step_timeout: float | None = opt(None, "head only: the least time a later step gets before it is re-driven, "
                                         "however fast the steps before it were (default: 15 s)", metavar="S")
    spot_check_rate: float | None = opt(None, "head only: the chance that the leader has each replica's share of a "
                                        "step recomputed by another replica before the step is applied; a replica "
                                        "caught lying is banned for the run (default: 1/16; 0: no checks)",
                                        metavar="P")
    probation_seats: int | None = opt(None, "head only: members of a stage seated in a step's reduce beyond those that "
                                      "did work lately, once a stage has more (every member sends every seated one "
                                      "its contribution: ids that do no work cost the swarm only these seats; "
                                      "default: 4)", metavar="N")
    next_step_wait: float | None = opt(None, "seconds a message for the next step may wait while this peer finishes "
                                       "the current one, before it is refused (default: 10 s)", metavar="S")
    ttl: float = opt(15.0, "seconds this peer's announcements live without a heartbeat (a dead peer is forgotten "
                     "after this)")
    health_port: int = opt(0, "serve GET /healthz on this port for Docker/systemd health checks (default: off)")
    health_host: str = opt("127.0.0.1", "address /healthz listens on")
    tensorboard: str | None = opt(None, "head/tail: per-step loss, tokens/s and wire bytes per token for "
                                  "TensorBoard", metavar="DIR")
    max_memory: str | None = opt(None, "take only a stage whose estimated peak memory fits this, e.g. 8GB, 8GiB or "
                                 "7.5G, all binary as cards are sold (24GB = 24GiB; `swarm memory` prints what "
                                 "each stage needs) (default: the free memory of a CUDA --device; no cap on the CPU)",
                                 metavar="SIZE")
    activation_checkpointing: bool = opt(False, "keep only each block's input for backward and recompute the rest "
                                         "there: far less memory (a 24 GB card holds a paper8b stage), about a "
                                         "third more compute, the same numbers")


class Reporter:
    """Appends one JSON object per line to the report file (if any) and flushes it at once."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.listeners: list[Callable[[str, dict], None]] = []  # e.g. the health monitor, for the head's steps

    def write(self, event: str, **fields) -> None:
        for listener in self.listeners:
            listener(event, fields)
        if not self.path:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")


def check_shared_constants(spec: RunSpec) -> None:
    want = spec.extra.get("basis_hash")
    if spec.codec != "subspace" or not want:
        return
    have = spec_basis(spec).hash()
    if have != want:
        raise JoinError(f"this machine generates shared constants with hash {have}, the swarm has {want}; "
                        f"install the same torch version as the coordinator (torch {torch.__version__} here).")


def _wire_summary(transport: Transport, totals: dict) -> dict:
    """What the peer put on the wire over its whole life (every stage it served), for the report:
    bytes per kind (activations, gradients, replica-sync contributions) and how many of its requests of each
    kind went over the direct channel (with its framing, docs/wire.md), the tokens the first two
    carried, the steps this peer took together with other replicas of its stage, and the seconds
    its stage's worker thread was busy (compute, packing, optimizer steps: what bounds a stage
    whose worker is busy all of the training time)."""
    kinds = (KIND_ACTIVATION, KIND_GRADIENT, KIND_REDUCE)
    out = {kind: transport.bytes_sent(kind) for kind in kinds}
    link = transport.link.stats() if transport.link is not None else None
    return {"bytes_out": out, "direct_out": {kind: transport.direct_requests.get(kind, 0) for kind in kinds},
            "tokens_out": dict(totals["sent_tokens"]), "refused": totals["refused"],
            "bytes_sent": transport.bytes_sent(), "bytes_received": transport.bytes_received(), "link": link,
            "tokens_done": totals["tokens_done"], "synced_steps": totals["synced_steps"],
            "worker_busy_s": totals["worker_busy_s"]}


async def run_peer(opts: PeerOptions, on_stage_peer: Callable[[StagePeer], None] | None = None) -> int:
    """Run one peer until its steps are done (head) or it is cancelled; returns an exit code.

    Joins the DHT, reads and checks the run spec, then serves a stage (`swarm/replicas/replica.py`)
    and, when the rebalancer moves it, the next one, in the same session.

    `on_stage_peer` is an extension point for code that embeds a peer: it is called with each
    `StagePeer` this process builds (one per stage it serves), once the peer is wired to the
    network and before it starts, so that what it changes or wraps holds from the peer's first
    message on (e.g. tests/doubles/ wraps a peer's handlers to play a hostile one)."""
    check_data_flags(opts.data, opts.tokens)  # a usage error (exit 2), before anything starts
    reporter = Reporter(opts.report)
    try:
        if opts.tensorboard:
            require("tensorboard", "--tensorboard")  # before joining: the Docker image leaves it out
        ticket = read_ticket(opts.ticket)
        if opts.max_memory:
            parse_size(opts.max_memory)  # a bad size is refused before joining
        if opts.spot_check_rate is not None and not 0 <= opts.spot_check_rate <= 1:
            raise ValueError(f"--spot-check-rate must be a probability between 0 and 1, not {opts.spot_check_rate}.")
        if opts.probation_seats is not None and opts.probation_seats < 0:
            raise ValueError(f"--probation-seats must be 0 or more, not {opts.probation_seats}.")
        reach_options = dht_options(opts.reachability, opts.initial_peers, opts.host_maddrs, opts.public_ip,
                                    opts.announce_maddrs)
    except (AdmissionError, ValueError) as e:
        raise JoinError(str(e)) from None
    try:
        lock = Identity.lock(opts.identity) if opts.identity else None
        identity = Identity.load_or_create(opts.identity) if opts.identity else Identity.generate()
    except IdentityError as e:
        raise JoinError(str(e)) from None
    if ticket is not None and ticket.peer_id != identity.peer_id:
        raise JoinError(f"the ticket is for peer {ticket.peer_id}, but this peer is {identity.peer_id}; start it "
                        f"with the --identity file the ticket was made for.")
    policy = AdmissionPolicy.from_ticket(ticket)
    dht = await asyncio.to_thread(start_dht, opts.initial_peers, opts.host_maddrs, identity, False, policy,
                                  **reach_options)
    p2p = transport = records = None
    monitor = PeerMonitor(opts.health_port, opts.health_host, opts.tensorboard)  # health record, /healthz, TensorBoard
    # synced: steps taken together with other replicas, over every stage served
    totals = {"sent_tokens": {KIND_ACTIVATION: 0, KIND_GRADIENT: 0}, "refused": 0, "tokens_done": 0,
              "worker_busy_s": 0.0, "synced_steps": 0}
    service: ReplicaService | None = None
    try:
        await monitor.start()  # /healthz answers "joining" (503) from here on
        sdht = SwarmDHT(dht, identity, ticket=ticket)
        asker, asking = await spec_asker(dht, opts.initial_peers, ticket.to_bytes() if ticket else b"")
        try:  # with every coordinator down, the peers of --initial-peers give the spec they hold
            spec = await fetch_spec(sdht, opts.trusted_key, opts.join_timeout, asker)
        finally:
            await asking.close()
        try:
            await sdht.adopt(spec)  # the swarm's rule for records: a private swarm refuses us here without a ticket
        except AdmissionError as e:
            raise JoinError(str(e)) from None
        # what this peer id costs in this run: computed once, kept beside --identity; before any record is written
        sdht.work = await proof_for(opts.identity, identity.peer_id, spec.run_hash, sdht.admission.policy.work_bits)
        check_shared_constants(spec)
        if spec.dtype == "bf16" and torch.device(opts.device).type == "cuda" \
                and not torch.cuda.is_bf16_supported(including_emulation=False):
            log.warning("this run computes in bf16, which this card has no hardware for: expect it to be slow "
                        "(a swarm of such cards runs --dtype fp16; docs/consumer-gpus.md)")
        requested = int(opts.stage) if opts.stage.isdigit() else None
        try:  # before any network work for the stage: a peer whose memory holds no stage says so and leaves
            allowed = fitting_stages(spec, memory_budget(opts.max_memory, opts.device), opts.device,
                                     opts.activation_checkpointing, requested)
        except ValueError as e:
            raise JoinError(str(e)) from None
        # asked first to dial back: the seat's holder and any coordinator with a live claim
        coordinators = await ActiveCoordinator(sdht, spec.run_hash, spec.extra.get("coordinator_peer") or "").peer_ids()
        dht, reach = await settle_reachability(  # a peer nobody can dial moves behind a relay (a new DHT node)
            dht, sdht, spec, f"subspace-swarm-{spec.run_hash}", opts.initial_peers, opts.reachability,
            restart=lambda o: start_dht(opts.initial_peers, opts.host_maddrs, identity, policy=policy, **o),
            stop=stop_dht, coordinators=coordinators)
        if reach.mode == "relayed":  # a new DHT node: its store starts from the swarm's rule again
            work, held, sdht = sdht.work, sdht.held, SwarmDHT(dht, identity, ticket=ticket)
            await sdht.adopt(spec)
            sdht.work, sdht.held = work, held
        p2p = await dht.replicate_p2p()
        peer_id = p2p.peer_id.to_base58()
        link = HomeLink.from_strings(opts.bandwidth, opts.latency) if (
            opts.bandwidth or opts.latency not in ("0", "", None)) else None
        transport = Transport(p2p, f"subspace-swarm-{spec.run_hash}", max_frame_bytes=transport_limit(spec),
                              timeout=opts.step_timeout, link=link,
                              ordered_kinds=(KIND_ACTIVATION, KIND_GRADIENT) if opts.send_order == "fifo" else ())
        if opts.trace_frames:
            transport.trace = FrameTrace(opts.trace_frames)
        if opts.direct == "on":  # a relayed peer cannot be dialed: it sends direct, and receives over libp2p
            await transport.enable_direct(port=opts.direct_port, serve=reach.mode != "relayed",
                                          announced=list(reach.maddrs))
        await DialBack().serve(transport)  # help other peers check that they can be reached
        records = await share_records(p2p, sdht, spec, opts.initial_peers, peer_id)  # the coordinator's, re-served
        # the run's tokenizer: served if held here; a peer with the token folder but not the file fetches it
        await share_run_tokenizer(spec, transport, sdht, opts.tokens, own_id=peer_id)
        maddrs = reach.maddrs
        router = Router(sdht, spec.run_hash, peer_id, maddrs, ttl=opts.ttl)
        reporter.listeners.append(monitor.on_event)

        def batches():
            store = run_token_store(spec, opts.tokens)  # --tokens, else the folder the run spec records, if any
            if store is not None:
                if opts.data:
                    raise DataError("this run trains on a prepared token folder, not on text; start the head "
                                    "with --tokens DIR instead of --data.")
                log.info("head: training on token folder %s (%d training tokens, vocabulary %d)", store.name,
                         store.train_tokens, store.manifest.vocab_size)
                return BatchSource(store, spec.seq_len, spec.microbatch_size, spec.data_seed).microbatch
            corpus, origin = run_corpus(spec, opts.data)  # --data, else what the run spec records
            check_corpus(spec, corpus)  # every head of the run reads the same text
            log.info("head: training on %s, %s (%d bytes)", corpus.name, origin, len(corpus))
            return BatchSource(corpus, spec.seq_len, spec.microbatch_size, spec.data_seed).microbatch

        link = LinkAdapter(transport, peer_id, IdentitySigner(identity))  # signs its boundary messages (issue 57)
        ctx = ReplicaContext(spec, peer_id, sdht, transport, router, link, opts.device,
                             batches, reporter, monitor, opts.ttl, opts.checkpoint_dir, opts.checkpoint_every,
                             opts.resume, opts.rebalance_period, opts.steps, opts.step_timeout, reach.mode,
                             opts.linger, opts.rebalance_hold, opts.min_step_timeout, opts.next_step_wait,
                             opts.allow_fresh_stage, allowed, opts.activation_checkpointing,
                             spot_check_rate=opts.spot_check_rate, probation_seats=opts.probation_seats,
                             on_stage_peer=on_stage_peer,
                             compile_blocks=bool(spec.extra.get("compile_blocks")))  # the run's, for every peer
        stage = recall_stage(opts.identity, spec.run_hash) if opts.stage == "auto" else None
        if stage is not None and stage not in allowed:
            log.info("this identity served stage %d, which does not fit this peer's memory: choosing again", stage)
            stage = None
        if stage is None:
            # a peer killed a moment ago still has a fresh record: count only those that answer
            answers = LivenessProbe(transport.p2p, PROBE_S).checker(spec.run_hash, transport)
            stage = await choose_stage(router, spec, opts.stage, answers=answers, allowed=allowed)
        while stage is not None:
            remember_stage(opts.identity, spec.run_hash, stage)  # a restart with this identity comes back here
            service = ReplicaService(ctx, stage)
            try:
                stage = await service.serve()
            finally:
                if service.peer is not None:
                    daemon = service.peer.daemon
                    for kind in totals["sent_tokens"]:
                        totals["sent_tokens"][kind] += daemon.sent_tokens[kind]
                    totals["refused"] += daemon.refused
                    totals["tokens_done"] += daemon.tokens_done
                    totals["worker_busy_s"] += daemon.worker_busy_s
                    totals["synced_steps"] += service.peer.commit.synced_steps
        return 0
    except PlacementError as e:
        raise JoinError(str(e)) from None
    finally:
        # A second Ctrl+C may cancel this cleanup halfway: the report goes first (no await), and
        # the daemons are stopped in a `finally` of their own so that no p2pd is left behind.
        if transport is not None:
            reporter.write("wire", **_wire_summary(transport, totals))
        try:
            await monitor.close()  # /healthz says "leaving" (503), then stops
        finally:
            if records is not None:
                await records.close()
            await close_node(dht, p2p, transport)
            if transport is not None and transport.trace is not None:
                transport.trace.close()
            if lock is not None:
                os.close(lock)


def configure_torch(threads: int | None) -> None:
    if threads:
        torch.set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
