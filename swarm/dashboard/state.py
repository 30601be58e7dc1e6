"""`DashboardState`: what the dashboard knows of a swarm, sampled from the DHT every second.

Each sample reads the run spec (from the DHT or, with no coordinator up for longer than it lives there, from the
peers' signed copies: `swarm/dht/spec_fetch.py` `read_spec`), every stage's announcements
(`all_stage_peers`) and the health records (verified by a `HealthBook`), and turns them into
one JSON-ready snapshot, the body of `/api/v1/state` (its schema is in `server.py`). Bounded
time series of loss (per training step, from the head's records) and swarm tokens/s live in
memory.

A killed peer's records live on until their ttl, so the records alone would show it online
for up to 15 s: with a `LivenessProbe`, every listed peer is also probed every
`PROBE_INTERVAL_S` (all at once, bounded), and `Presence` shows a peer that missed two probes
in a row as offline at once (so within ~5 s of its death), and any peer that went offline as
an "offline" row for `OFFLINE_KEEP_S`, so that a page shows what went away instead of
silently shrinking.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass

from hivemind.utils import get_dht_time

from protocol.spec import RunSpec
from swarm.dht import ActiveCoordinator, RecordError, StageAnnouncement, SwarmDHT
from swarm.dht.record_share import PeerRecords
from swarm.dht.spec_fetch import JoinError, read_spec
from swarm.monitor.coverage import uncovered_reason
from swarm.monitor.health import HealthRecord, fetch_health
from swarm.monitor.liveness import LivenessProbe
from swarm.monitor.scalars import ScalarLog
from swarm.net.dense_baseline import dense_bytes_per_token
from swarm.trust.admission import AdmissionPolicy

from .book import HealthBook
from .presence import Presence

log = logging.getLogger(__name__)

SPEC_REFRESH_S = 30.0  # re-read the run spec this often (it is re-published, rarely changes)
PROBE_INTERVAL_S = 2.0  # probe every listed peer this often (a round that takes longer starts the next at once)
BALANCED = 0.9  # a stage is the bottleneck only below this fraction of the fastest stage's tokens/s


@dataclass
class _Series:
    maxlen: int

    def __post_init__(self) -> None:
        self.time: deque[float] = deque(maxlen=self.maxlen)
        self.step: deque[int] = deque(maxlen=self.maxlen)
        self.value: deque[float] = deque(maxlen=self.maxlen)

    def add(self, t: float, step: int, value: float) -> None:
        self.time.append(t)
        self.step.append(step)
        self.value.append(value)

    def to_json(self) -> dict:
        return {"time": list(self.time), "step": list(self.step), "value": list(self.value)}


def _run_summary(spec: RunSpec, fingerprint: str) -> dict:
    return {"hash": spec.run_hash, "name": spec.name, "codec": spec.codec, "rank": spec.boundary_width,
            "stages": spec.n_stages, "stage_layers": list(spec.stage_layers), "d_model": spec.d_model,
            "n_layers": spec.n_layers, "vocab": spec.vocab, "seq_len": spec.seq_len, "batch_size": spec.batch_size,
            "wire_dtype": spec.wire_dtype, "quant": spec.quant, "basis_interval": spec.basis_interval,
            "replica_sync": spec.replica_sync, "replica_sync_rank": spec.replica_sync_rank, "key": fingerprint}


def _peer_view(ann: StageAnnouncement | None, h: HealthRecord | None, key: str | None, now: float) -> dict:
    """One row of the peer table, from the announcement and/or the health record (the newer one's state).

    Only an announced peer counts as online: routers find peers by their announcements, so a
    health record alone (a peer mid-exit, or someone else's junk) is shown as "unannounced".
    """
    newest = max((x for x in (ann, h) if x is not None), key=lambda x: x.timestamp)
    state = newest.state if ann is not None else "unannounced"
    # a head that does not lead announces its measured compute speed (peer/step/calibration.py): shown as such,
    # and not as traffic, so that stage sums and the bottleneck stay what passed through the stages
    standby = ann is not None and ann.stage == 0 and not ann.leads and state == "online"
    view = {"peer_id": newest.peer_id, "stage": newest.stage, "state": state, "online": state == "online",
            "announced": ann is not None, "age_s": round(max(0.0, now - newest.timestamp), 1),
            "health": h is not None, "key": key, "standby": standby,
            "measured_tokens_per_s": ann.throughput if standby else None,
            "tokens_per_s": ann.throughput if ann and not standby else 0.0, "queue": ann.queue if ann else 0,
            "basis_version": ann.basis_version if ann else 0, "version": ann.version if ann else None}
    if h is not None:
        view.update(
            step=h.step, tokens_per_s=h.tokens_per_s, queue=h.queue, loss=h.loss, bytes_in_per_s=h.bytes_in_per_s,
            bytes_out_per_s=h.bytes_out_per_s, forward_bytes_per_token=h.forward_bytes_per_token,
            backward_bytes_per_token=h.backward_bytes_per_token, sync_bytes_per_step=h.sync_bytes_per_step,
            codec=h.codec, rank=h.rank,
            basis_version=h.basis_version, basis_updated_step=h.basis_updated_step, device=h.device,
            memory_bytes=h.memory_bytes, peak_memory_bytes=h.peak_memory_bytes, uptime_s=round(h.uptime_s, 1),
            reachability=h.reachability,
            version=h.version, refused=h.refused, banned=dict(h.banned), checkpoint_error=h.checkpoint_error or None)
    return view


def _mark_bottleneck(stages: list[dict]) -> None:
    """Uncovered stages; else the slowest stage, if clearly slower (in a synchronous pipeline every
    stage passes the same tokens, so differences within BALANCED are measurement noise)."""
    uncovered = [st for st in stages if not st["covered"]]
    for st in uncovered:
        st["bottleneck"] = True
    speeds = [st["tokens_per_s"] for st in stages]
    if not uncovered and max(speeds) > 0 and min(speeds) < BALANCED * max(speeds):
        min(stages, key=lambda st: (st["tokens_per_s"], st["stage"]))["bottleneck"] = True


class DashboardState:
    def __init__(self, sdht: SwarmDHT, *, trusted_key: bytes | None = None, interval: float = 1.0,
                 history: int = 2000, scalars: ScalarLog | None = None, probe: LivenessProbe | None = None,
                 presence: Presence | None = None, peers: PeerRecords | None = None) -> None:
        self.sdht, self.trusted_key, self.interval, self.scalars = sdht, trusted_key, interval, scalars
        self.peers = peers  # whom to ask for the run spec when the DHT holds none (None: the DHT only)
        self.probe = probe  # None: the records alone say who is there
        self.presence = presence or Presence()
        self._listed: list[str] = []  # peers with live records at the last sample: the next probe round's
        self.spec: RunSpec | None = None
        self.samples = 0
        self._fingerprint = ""
        self._dense = 0.0
        self._spec_read = -SPEC_REFRESH_S
        self._book: HealthBook | None = None
        self._active: ActiveCoordinator | None = None
        self._error: str | None = "no sample yet."
        self._loss = _Series(history)
        self._speed = _Series(history)
        self._last_loss_step = 0
        self._scalar_loss_step = 0  # the last loss step written to TensorBoard
        self._last_head_stamp = 0.0
        self._snapshot: dict = self._empty()

    def _empty(self) -> dict:
        return {"updated": time.time(), "error": self._error, "run": None, "stages": [], "peers": [], "banned": [],
                "wire": None, "basis": None, "coordinator": None,
                "series": {"loss": self._loss.to_json(), "tokens_per_s": self._speed.to_json()},
                "invalid_records": self._book.invalid if self._book else 0,
                "problems": list(self._book.problems) if self._book else []}

    def snapshot(self) -> dict:
        return self._snapshot

    async def run(self) -> None:
        """Sample (and probe) until cancelled; a failed sample is logged and shown on the page, never fatal."""
        probing = asyncio.create_task(self._probe_forever()) if self.probe is not None else None
        try:
            while True:
                try:
                    await self.sample()
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a DHT hiccup: say so on the page and try again next tick
                    log.warning("dashboard sample failed (%s: %s)", type(e).__name__, e)
                    self._error = f"the last sample failed ({type(e).__name__}: {e})."
                    self._snapshot = {**self._snapshot, "error": self._error}
                await asyncio.sleep(self.interval)
        finally:
            if probing is not None:
                probing.cancel()
                await asyncio.gather(probing, return_exceptions=True)

    async def _probe_forever(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.probe_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # never let a probe take the dashboard down; the records still show
                log.debug("a probe round failed (%s: %s)", type(e).__name__, e)
            await asyncio.sleep(max(0.0, PROBE_INTERVAL_S - (time.monotonic() - started)))

    async def probe_once(self) -> None:
        """Probe every peer listed at the last sample, and tell `presence` who answered."""
        if self.probe is None or self.spec is None or not self._listed:
            return
        for peer, answered in (await self.probe.probe_all(self.spec.run_hash, list(self._listed))).items():
            self.presence.probed(peer, answered)

    async def _refresh_spec(self) -> None:
        if self.spec is not None and time.monotonic() - self._spec_read < SPEC_REFRESH_S:
            return
        try:
            found = await read_spec(self.sdht, self.trusted_key.hex() if self.trusted_key else None, self.peers)
        except (RecordError, JoinError) as e:
            self._error = str(e)
            return
        self._spec_read = time.monotonic()
        if found is None:
            if self.spec is None:
                self._error = (f"no run spec in the DHT{' or at the peers asked' if self.peers else ''} yet: is "
                               f"--initial-peers the address of a running swarm (with no coordinator up, a private "
                               f"swarm's peers hand it to ticket holders only)?")
            return
        signed, spec = found
        if self.spec is None or spec.run_hash != self.spec.run_hash:
            self.spec, self._fingerprint = spec, signed.fingerprint
            self._dense = dense_bytes_per_token(spec)
            await self.sdht.adopt(spec)  # its key (and, if private, tickets) is the rule for every record read
            self._book = HealthBook(spec.run_hash, AdmissionPolicy.for_spec(spec))
            self._active = ActiveCoordinator(self.sdht, spec.run_hash, str(spec.extra.get("coordinator_peer", "")))

    async def sample(self) -> None:
        await self._refresh_spec()
        spec, book = self.spec, self._book
        if spec is None:
            self._snapshot = self._empty()
            return
        anns, raw = await asyncio.gather(self.sdht.all_stage_peers(spec.run_hash, spec.n_stages),
                                         fetch_health(self.sdht, spec.run_hash))
        now = get_dht_time()
        book.update(raw, now)
        self._error = None
        self._snapshot = self._build(spec, anns, book, now)
        seat = await self._active.refresh()  # which coordinator holds the seat (read at most every 5 s)
        self._snapshot["coordinator"] = {"peer": await self._active.peer_id() or None, "seat_held": seat is not None,
                                         "term": seat.term if seat else None, "since": seat.since if seat else None}
        self.samples += 1

    def _build(self, spec: RunSpec, anns: dict[int, list[StageAnnouncement]], book: HealthBook, now: float) -> dict:
        health = book.live()
        by_peer = {a.peer_id: a for stage in anns.values() for a in stage}
        listed = sorted(set(by_peer) | set(health))
        self._listed = listed
        peers = self.presence.rows([_peer_view(by_peer.get(p), health[p].record if p in health else None,
                                               book.key_of(p), now) for p in listed])
        online = [v for v in peers if v["online"]]

        stages = []
        for s in range(spec.n_stages):
            here = [v for v in online if v["stage"] == s]
            why = uncovered_reason(s, [v["state"] for v in peers if v["stage"] == s])
            stages.append({"stage": s, "layers": spec.stage_layers[s], "peers": len(here),
                           "tokens_per_s": sum(v["tokens_per_s"] for v in here), "covered": why is None,
                           "why": why, "bottleneck": False})
        _mark_bottleneck(stages)

        # Swarm figures come from announced peers only (a health record alone may be anyone's),
        # and not from those that stopped answering (their records outlive them).
        records = [s.record for p, s in health.items() if p in by_peer and not self.presence.dead(p)]
        act_bytes = sum(r.act_bytes_out for r in records)
        act_tokens = sum(r.act_tokens_out for r in records)
        grad_bytes = sum(r.grad_bytes_out for r in records)
        grad_tokens = sum(r.grad_tokens_out for r in records)
        forward = act_bytes / act_tokens if act_tokens else None
        # replica sync: bytes per step of the busiest replica (the sync is as slow as its slowest sender)
        syncing = [r.sync_bytes_per_step for r in records if r.sync_bytes_per_step is not None]
        wire = {"forward_bytes_per_token": forward,
                "backward_bytes_per_token": grad_bytes / grad_tokens if grad_tokens else None,
                "dense_bytes_per_token": self._dense,
                "compression_ratio": self._dense / forward if forward else None,
                "sync_bytes_per_step": max(syncing) if syncing else None,
                "replica_sync": spec.replica_sync}

        versions = [r for r in records if r.state == "online"]
        top = max(versions, key=lambda r: (r.basis_version, r.basis_updated_step), default=None)
        basis = {"version": top.basis_version if top else None, "updated_step": top.basis_updated_step if top else None,
                 "mixed": len({r.basis_version for r in versions}) > 1}

        banned: dict[str, dict] = {}
        for r in records:
            for peer, failures in r.banned.items():
                entry = banned.setdefault(peer, {"peer_id": peer, "failures": 0, "reported_by": []})
                entry["failures"] = max(entry["failures"], failures)
                entry["reported_by"].append(r.peer_id)
        for r in records:  # banned for the run: the reason where a peer (the leader) gives one
            for peer, why in r.run_bans.items():
                entry = banned.setdefault(peer, {"peer_id": peer, "failures": 0, "reported_by": []})
                entry["for_run"] = True
                entry["reason"] = entry.get("reason") or why or None
                if r.peer_id not in entry["reported_by"]:
                    entry["reported_by"].append(r.peer_id)

        self._extend_series(spec, records)
        snapshot = {
            "updated": time.time(), "error": None, "run": _run_summary(spec, self._fingerprint),
            "stages": stages, "peers": peers,
            "banned": sorted(banned.values(), key=lambda b: (not b.get("for_run"), -b["failures"])),
            "wire": wire, "basis": basis,
            "series": {"loss": self._loss.to_json(), "tokens_per_s": self._speed.to_json()},
            "invalid_records": book.invalid, "problems": list(book.problems),
        }
        self._write_scalars(snapshot)
        return snapshot

    def _extend_series(self, spec: RunSpec, records: list[HealthRecord]) -> None:
        heads = [r for r in records if r.stage == 0]
        # The head's loss is the step's mean; a tail's is one microbatch's: use it only with no head at all.
        sources = heads or [r for r in records if r.stage == spec.n_stages - 1]
        points = sorted((p for r in sources for p in (r.loss_history or ([[r.step, r.loss, r.timestamp]]
                                                                         if r.loss is not None else []))),
                        key=lambda p: p[0])
        for step, loss, t in points:
            if step > self._last_loss_step:
                self._loss.add(t, int(step), loss)
                self._last_loss_step = int(step)
        stamp = max((r.timestamp for r in heads), default=0.0)
        # a point per new head record, once training
        if stamp > self._last_head_stamp and max(r.step for r in heads) > 0:
            self._last_head_stamp = stamp
            self._speed.add(stamp, max(r.step for r in heads), sum(r.tokens_per_s for r in heads))

    def _write_scalars(self, snapshot: dict) -> None:
        if self.scalars is None:
            return
        step = max((v.get("step", 0) for v in snapshot["peers"] if v["online"]), default=0)
        losses = self._loss.to_json()
        for s, v in zip(losses["step"], losses["value"]):
            if s > self._scalar_loss_step:
                self.scalars.write(s, {"swarm/loss": v})
                self._scalar_loss_step = s
        wire = snapshot["wire"]
        self.scalars.write(step, {
            "swarm/tokens_per_s": self._speed.value[-1] if self._speed.value else None,
            "swarm/peers": sum(v["online"] for v in snapshot["peers"]),
            "swarm/stages_covered": sum(st["covered"] for st in snapshot["stages"]),
            "swarm/invalid_records": snapshot["invalid_records"],
            "wire/forward_bytes_per_token": wire["forward_bytes_per_token"],
            "wire/compression_ratio": wire["compression_ratio"],
            "wire/sync_bytes_per_step": wire["sync_bytes_per_step"]})
        self.scalars.flush()
