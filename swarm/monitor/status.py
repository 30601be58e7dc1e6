"""`swarm status`: a table of a swarm's stages and the peers that serve them, read from the DHT.

With no coordinator up for longer than the run spec and the lease live in the DHT, both are the peers' signed
copies (`swarm/dht/spec_fetch.py`, checked as a joiner checks them), and the table says that no coordinator holds
the seat.

A killed peer's announcement lives on until its ttl, so before printing, every listed peer is
probed once over libp2p (`liveness.py`, at most 2 s): one that does not answer is shown with
state "offline" and `answers` no (its announced state stays in the JSON as `announced_state`),
and does not count as serving its stage. A private swarm with no coordinator up is read with a ticket
(`--identity FILE --ticket TICKET`: `reader_ticket.py`). Each peer's peak memory comes from its signed health
record (`peak_memory_bytes`: `torch.cuda.max_memory_allocated` on a GPU, peak RSS on a CPU; null
without a valid record).
"""
from __future__ import annotations

import asyncio
import json
import time

from hivemind.utils import get_dht_time

from protocol.spec import RunSpec
from swarm.dht import ActiveCoordinator, RecordError, SwarmDHT, close_node, start_dht
from swarm.dht.record_service import spec_asker
from swarm.dht.spec_fetch import read_spec
from swarm.trust.admission import AdmissionPolicy

from .coverage import uncovered_reason
from .health import fetch_health, parse_health, reachability_of
from .liveness import LivenessProbe
from .reader_ticket import ReaderTicket


async def swarm_state(initial_peers: list[str], reader: ReaderTicket | None = None) -> dict:
    """The run spec and every live announcement, each with whether its peer answers, and the heads
    whose lease the swarm key revoked (with the rollback it ordered, if any), and the peers banned for the run
    (with the reason the leader gives), as plain data. `reader`: the identity and ticket to ask a private swarm's
    peers with (`reader_ticket.py`; None: a fresh identity, no ticket)."""
    reader = reader or ReaderTicket()
    dht = await asyncio.to_thread(start_dht, initial_peers, ["/ip4/127.0.0.1/tcp/0"], reader.identity, True)
    p2p = asking = None
    try:
        sdht = SwarmDHT(dht)
        # with no coordinator up for longer than the spec lives in the DHT, the peers' signed copy, checked as a
        # joiner checks it; and the newest lease they hold (for its age and revocations)
        sdht.record_peers, asking = await spec_asker(dht, initial_peers, reader.request_bytes())
        found = await read_spec(sdht, None, sdht.record_peers)
        if found is None:
            return {"run": None, "stages": {}}
        signed, spec = found
        await sdht.adopt(spec)  # a private swarm's announcements count only with a ticket
        peers = await sdht.all_stage_peers(spec.run_hash, spec.n_stages)
        now = get_dht_time()
        p2p = await dht.replicate_p2p()
        answers = await LivenessProbe(p2p).probe_all(spec.run_hash, sorted({a.peer_id for s in peers.values()
                                                                           for a in s}))
        peaks, bans = await _health(sdht, spec, {a.peer_id for s in peers.values() for a in s})
        try:
            lease = await sdht.fetch_lease(spec.run_hash)  # only the swarm key's counts
        except Exception:  # a DHT hiccup: the table without the lease's news
            lease = None
        active = ActiveCoordinator(sdht, spec.run_hash, str(spec.extra.get("coordinator_peer", "")))
        seat = await active.refresh(force=True)  # which coordinator holds the seat (swarm/coordinator/seat.py)
        stages = {s: [{"peer": a.peer_id, "state": a.state if answers[a.peer_id] else "offline",
                       "announced_state": a.state, "answers": answers[a.peer_id], "throughput": a.throughput,
                       # a head that does not lead announces its measured compute speed, not traffic
                       "standby": a.stage == 0 and not a.leads and a.state == "online",
                       "queue": a.queue, "basis_version": a.basis_version, "age_s": round(now - a.timestamp, 1),
                       "reachability": reachability_of(a.maddrs), "peak_memory_bytes": peaks.get(a.peer_id)}
                      for a in anns]
                  for s, anns in peers.items()}
        return {
            "run": {"hash": spec.run_hash, "name": spec.name, "codec": spec.codec, "rank": spec.rank,
                    "stages": spec.n_stages, "key": signed.fingerprint},
            "stages": stages,
            "paused": {s: why for s in range(spec.n_stages)
                       if (why := uncovered_reason(s, [p["state"] for p in stages.get(s, [])]))},
            "bans": bans,
            # the coordinator re-signs the lease every 30 s (swarm/replicas/leases.py): how long ago it last did says
            # whether it is up, without a request to it
            "coordinator": {"peer": await active.peer_id() or None,
                            "lease_age_s": round(time.time() - lease.issued, 1) if lease is not None else None,
                            "term": seat.term if seat else None, "since": seat.since if seat else None,
                            "seat_held": seat is not None,
                            # claims were made, none is live: every coordinator, standbys too, is down
                            "seat_lapsed": seat is None and active.newest is not None},
            "revoked": [] if lease is None else [
                {"head": p, "rollback_to": lease.rollback_to if lease.rollback_id and p == lease.rollback_of else None,
                 "caught": lease.rollback_caught if p == lease.rollback_of else None} for p in lease.revoked],
        }
    finally:
        if asking is not None:
            await asking.close()
        await close_node(dht, p2p)


async def _health(sdht: SwarmDHT, spec: RunSpec, announced: set[str]) -> tuple[dict[str, int], list[dict]]:
    """From the valid health records: peer id -> its peak memory, and the peers banned for the run with the
    reason (the leading head's) and who reports each; only announced peers' reports count (anyone may store a
    record under a fresh id, but not announce a stage in its run without being in it)."""
    peaks, bans = {}, {}
    policy = AdmissionPolicy.for_spec(spec)
    for subkey, value, expires in await fetch_health(sdht, spec.run_hash):
        try:
            record = parse_health(subkey, value, expires, policy).record
        except RecordError:
            continue  # not a peer's valid record: nothing to show
        peaks[str(subkey)] = record.peak_memory_bytes
        if record.peer_id not in announced:
            continue
        for peer, why in record.run_bans.items():
            ban = bans.setdefault(peer, {"peer": peer, "reason": "", "reported_by": []})
            ban["reason"] = ban["reason"] or why
            ban["reported_by"].append(record.peer_id)
    return peaks, sorted(bans.values(), key=lambda b: b["peer"])


COORDINATOR_QUIET_S = 120.0  # four of its lease re-signings missed: it looks down


def _coordinator_line(c: dict) -> str:
    who = f"coordinator …{c['peer'][-10:]}" if c.get("peer") else "coordinator (not named in the run spec)"
    age = c.get("lease_age_s")
    if c.get("seat_lapsed"):  # every claim lapsed: the lease's age says nothing more (it may be a peer's copy)
        last = f" (the last was …{c['peer'][-10:]})" if c.get("peer") else ""
        return (f"no coordinator holds the seat{last}: training goes on and newcomers get the run spec from the "
                f"peers, but no new head can lead, no basis is re-fitted, no liar is revoked and no snapshot is "
                f"vouched for until one is back (`swarm coordinator --standby --initial-peers ADDR --key KEY` starts "
                f"one).")
    if age is None:
        return f"{who}: no lease signed yet (no head has announced, or the coordinator has not started it)."
    if c.get("seat_held"):  # a claim to the seat is renewed every few seconds: it is up
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c["since"]))
        return f"{who}: active since {since} (term {c['term']}), it re-signed the leader lease {age:.0f} s ago."
    if age <= COORDINATOR_QUIET_S:
        return f"{who}: up, it re-signed the leader lease {age:.0f} s ago."
    return (f"{who}: looks down, its last lease is {age / 60:.0f} min old; training goes on, but no new head can "
            f"lead, no basis is re-fitted, no liar is revoked and no snapshot is vouched for until it is back.")


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.1f}G"


def _speed(p: dict) -> str:
    return f"~{p['throughput']:.0f}" if p.get("standby") else f"{p['throughput']:.0f}"


def format_table(state: dict) -> str:
    run = state["run"]
    if run is None:
        return ("no run spec found in the DHT or at the peers asked: is --initial-peers the address of the "
                "coordinator or of a running peer of the swarm (a private swarm's peers re-serve it to ticket "
                "holders only: pass --identity and --ticket, `swarm admit`'s ticket for that identity)?")
    lines = [f"run {run['hash']} ({run['name']}), codec {run['codec']} rank {run['rank']}, "
             f"{run['stages']} stages, coordinator key {run['key']}",
             f"{'stage':>5}  {'peer':<12} {'state':<8} {'answers':<7} {'reach':<8} {'tok/s':>8} {'queue':>5} "
             f"{'basis':>5} {'age s':>6} {'peak mem':>8}"]
    silent = []
    for s in range(run["stages"]):
        peers = state["stages"].get(s, [])
        for p in peers:
            lines.append(f"{s:>5}  {'…' + p['peer'][-10:]:<12} {p['state']:<8} {'yes' if p['answers'] else 'no':<7} "
                         f"{p['reachability']:<8} {_speed(p):>8} "
                         f"{p['queue']:>5} {p['basis_version']:>5} {p['age_s']:>6} "
                         f"{_gib(p.get('peak_memory_bytes')):>8}")
            if not p["answers"]:
                silent.append(f"…{p['peer'][-10:]}")
        if not any(p["answers"] for p in peers):
            lines.append(f"{s:>5}  {'(none)':<12} MISSING")
    if "coordinator" in state:
        lines.append(_coordinator_line(state["coordinator"]))
    for _, why in sorted(state.get("paused", {}).items()):
        lines.append(f"paused: {why}.")
    if any(p.get("standby") for peers in state["stages"].values() for p in peers):
        lines.append("~N tok/s: a head that does not lead (it computes the share of each step the leader gives "
                     "it, and takes over if the leader dies): its measured compute speed (one microbatch's "
                     "forward+backward), not traffic.")
    for r in state.get("revoked", []):
        head = (f"head …{r['head'][-10:]} lost its lease for good: it fed other data than the run's, or called the "
                f"run's data other")
        if r.get("rollback_to") is not None:
            lines.append(f"{head}; the swarm key ordered its steps rolled back to step {r['rollback_to']} (it was "
                         f"caught at step {r['caught']}).")
        else:
            lines.append(f"{head}; no rollback is ordered for it: it drove no step, or no snapshot from before it "
                         f"led exists and the steps it drove stay applied (the coordinator's log says which).")
    for b in state.get("bans", []):
        lines.append(f"banned for the run: …{b['peer'][-10:]}: {b['reason'] or 'convicted by the leading head'} "
                     f"(reported by {len(b['reported_by'])} peer{'s' if len(b['reported_by']) > 1 else ''}; "
                     f"`swarm unban {b['peer']}` lifts it)")
    if silent:
        lines.append(f"offline (did not answer a probe: stopped, or unreachable from here): {', '.join(silent)}; "
                     f"a stopped peer's announcement lives on until its ttl.")
    return "\n".join(lines)


async def print_status(initial_peers: list[str], as_json: bool = False, reader: ReaderTicket | None = None) -> int:
    state = await swarm_state(initial_peers, reader)
    print(json.dumps(state, indent=1) if as_json else format_table(state))
    return 0 if state["run"] is not None else 1
