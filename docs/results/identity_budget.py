"""What an attacker can field per stage under the default identity costs, and what its ids cost the swarm
(issue 57, item 5). Usage: python docs/results/identity_budget.py OUT_DIR [--quick]  (writes identity_budget.json)

1. `work`: find_proof's sha256 per CPU-second here, so CPU-seconds per id at --id-work-bits 22 = 2^22 / rate.
2. `fielded`: ids per stage each attacker keeps past `cap_per_network` (the readers' own function) at N = 4 per
   /24 or /48 and M = 16 per /16 or /32, against the same attacker under the rule before M (N alone).
3. `throughput`: the simulator (swarm/bench/simulate, the project's router over modelled GPUs and 80 Mbit/s home
   links; `large`, 4 stages, 3 honest replicas per stage, 12 microbatches a step; replica sync exact, the run
   spec's default, whose contribution is a stage's whole gradient, and powersgd rank 8) with K attacker
   ids on every stage, of two kinds:
   - "bare": a node that announces the stage, answers commands and takes part in the reduce with an empty
     contribution (a standby's: no tensors), and never returns work: after one failed probe (probation) routers
     avoid it, which the model takes as never being picked (the probe's own cost is test_fake_ids' figure);
     every honest replica sends it its whole contribution each round where it is seated (`ReduceExchange` offers
     to every member the leader names);
   - "replica": a real replica on its own consumer GPU (drawn as the honest ones are) behind a 1 Gbit/s link:
     real compute the attacker pays per id.
   and once K bare ids on stage 2 only (the commit waits for every stage's reduce: one stage is enough);
   each under the leader's seats (peer/step/seats.py: work first, `PROBATION_SEATS` more) and under the rule
   before them, every member seated (`probation_seats=None`), side by side. A stage of more than MAX_GROUP
   members under the rule before is not run: its reduce command cannot be sent (`limits`), so no step.
4. `limits`: the reduce command's member list (`protocol.fields.MAX_GROUP`) at 64 and 65 members, decoded as a
   replica decodes it; and the leader's state-hash tally (`peer/checks/state_votes.py`, the rule alone, in
   memory) for a stage of 3 honest replicas and 4 ids that report one made-up hash, every member counted: what the
   leader did before it counted only the hashed step's workers (tests/peer/test_workless_votes.py).
"""
from __future__ import annotations

import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from peer.checks.state_votes import StateVotes
from peer.step.seats import PROBATION_SEATS
from protocol.control import Command, decode_command, encode_command
from protocol.fields import MAX_GROUP
from protocol.spec import preset
from protocol.wire import WireError
from swarm.bench.simulate.engine import now, run_virtual
from swarm.bench.simulate.hardware import CONSUMER, LinkDraw, gpu, stage_flops, tokens_per_microbatch, wire_bytes
from swarm.bench.simulate.peers import SimPeer, SimSwarm, SwarmConfig
from swarm.bench.simulate.step import AttemptFailed, StepDriverModel, StepOptions, _all
from swarm.dht.network_cap import cap_per_network
from swarm.replicas.router import Router
from swarm.trust.work import find_proof

N, M, BITS = 4, 16, 22  # the coordinator's defaults: --ids-per-network, --ids-per-block, --id-work-bits
EMPTY = 300  # bytes of an empty contribution (no tensors) with its framing
ATTACKER_UPLINK_BPS, ATTACKER_LATENCY_S = 1e9, 0.01


def work_rate(ids: int = 24, bits: int = 16) -> dict:
    """sha256 per CPU-second of find_proof over `ids` proofs (CPU time: load on the machine does not skew it)."""
    t0, hashes = time.process_time(), 0
    for i in range(ids):
        hashes += find_proof("a" * 64, f"12D3KooWbudget{i}", bits)[1]
    rate = hashes / (time.process_time() - t0)
    return {"proofs": ids, "bits": bits, "hashes": hashes, "hashes_per_cpu_s": rate,
            "cpu_s_per_id_at_22_bits": 2**BITS / rate}


def fielded() -> dict:
    """Ids per stage each attacker keeps, under N alone (before) and under N and M (now)."""
    def count(addresses: list[str]) -> dict:
        ids = [SimpleNamespace(peer_id=f"a{i:06d}") for i in range(len(addresses))]
        seen = {p.peer_id: [a] for p, a in zip(ids, addresses)}
        first = {p.peer_id: float(i) for i, p in enumerate(ids)}
        return {"offered": len(ids), "before": len(cap_per_network(ids, N, seen, first)[0]),
                "now": len(cap_per_network(ids, N, seen, first, per_block=M)[0])}
    per = range(2 * N)  # each network offers twice the cap
    one24 = [f"/ip4/7.7.7.{j + 1}/tcp/1" for j in per]
    spread24 = [f"/ip4/{11 + i // 200}.{i % 200}.{(7 * i) % 250}.{j + 1}/tcp/1" for i in range(100) for j in per]
    one16 = [f"/ip4/7.7.{i}.{j + 1}/tcp/1" for i in range(100) for j in per]
    one32 = [f"/ip6/2001:470:{i:x}::{j + 1}/tcp/1" for i in range(10_000) for j in range(N)]
    eight32 = [f"/ip6/2a0{i % 8}:1:{i // 8:x}::{j + 1}/tcp/1" for i in range(10_000) for j in range(N)]
    return {"one machine: one /24 (or /48)": count(one24), "100 /24s in 100 /16s": count(spread24),
            "100 /24s in one /16": count(one16), "10,000 /48s in one /32": count(one32),
            "10,000 /48s in 8 /32s (an LIR's /29)": count(eight32)}


def limits() -> dict:
    """Does a replica decode a reduce command that names 64, 65 members? Whose state hash wins a stage's tally?"""
    out = {"MAX_GROUP": MAX_GROUP}
    for n in (MAX_GROUP, MAX_GROUP + 1):
        body = encode_command(Command("r" * 16, 0, 0, "reduce", [f"12D3KooW{i:044d}" for i in range(n)]))
        try:
            decode_command(body, "r" * 16)
            out[f"{n}_members"] = "decoded"
        except WireError as e:
            out[f"{n}_members"] = f"refused: {e}"
    votes, stages = StateVotes("head"), {"head": 0, **{f"h{i}": 1 for i in range(3)}, **{f"a{i}": 1 for i in range(N)}}
    for p in stages:
        if p != "head":
            votes.add(p, (5, "made-up" if p.startswith("a") else "honest"))
    agreed, odd = votes.settle(5, stages)
    out["state_vote_3_honest_4_made_up"] = {"agreed": agreed[1], "taken_out": odd}
    return out


class _Driver(StepDriverModel):
    """The model's step, where the `bare` ids' contributions are empty (the model sends every replica's whole one)."""

    bare: frozenset = frozenset()

    async def _reduce(self, leader: SimPeer, stage: int, group: list[SimPeer]) -> None:
        n, loop = len(group), asyncio.get_running_loop()
        rounds = self.wire.sync_rounds[stage] if n > 1 else ()
        sent = [[loop.create_future() for _ in group] for _ in rounds]

        async def replica(i: int, p: SimPeer) -> None:
            if p is not leader and not await self.swarm.send(leader, p, self.wire.command):
                raise AttemptFailed(f"replica {p.peer_id} of stage {stage} did not reduce")
            for k, b in enumerate(rounds):
                sizes = [EMPTY if q.peer_id in self.bare else b for q in group]
                await p.link.send((n - 1) * sizes[i])  # its contribution to each other member, whole
                sent[k][i].set_result(None)
                await asyncio.gather(*sent[k])
                await p.link.receive(sum(sizes) - sizes[i])
            if p is not leader and not await self.swarm.send(p, leader, self.wire.command):
                await self._never()
        await _all(replica(i, p) for i, p in enumerate(group))


async def _swarm(k: int, kind: str, honest: int, steps: int, seed: int, one_stage: bool, sync: str,
                 seated: str) -> dict:
    spec = preset("large", replica_sync=sync)
    work, wire = stage_flops(spec), wire_bytes(spec)
    cards = [(name, gpu(name, 0.4).flops_per_second) for name in CONSUMER]
    links = LinkDraw((80.0, 80.0), (10.0, 150.0))
    swarm = SimSwarm(SwarmConfig(spec, work, cards, links, wire.state, seed=seed))
    await swarm.populate(honest * spec.n_stages)
    loop, draw, bare = asyncio.get_running_loop(), random.Random(seed + 1), set()
    for stage in (2,) if one_stage else range(spec.n_stages):
        for i in range(k):
            pid = f"atk{stage}_{i:03d}"
            name, rate = draw.choice(cards)
            router = Router(swarm.dht, spec.run_hash, pid, [], ttl=swarm.cfg.ttl, clock=loop.time)
            peer = SimPeer(pid, name, rate, links.link(ATTACKER_UPLINK_BPS, ATTACKER_LATENCY_S, loop.time),
                           ATTACKER_LATENCY_S, router, now(), stage=stage, ready=True)
            swarm.peers[pid], swarm.dht.alive[pid] = peer, True
            await swarm._announce(peer, "online")
            if kind == "bare":
                bare.add(pid)
    for p in swarm.peers.values():  # probation failed once: routers pick no bare id (it is still a member)
        original = p.router._on_probation
        p.router._on_probation = (lambda orig: lambda stage, live: orig(stage, [x for x in live if x not in bare]))(
            original)
    microbatches = 4 * honest
    probation = PROBATION_SEATS if seated == "work first" else None
    driver = _Driver(swarm, StepOptions(microbatches, first_timeout=None, probation_seats=probation), wire)
    driver.bare = frozenset(bare)
    await driver.run(steps)
    recs = driver.records
    step_tokens = microbatches * tokens_per_microbatch(spec)
    tps = (len(recs) - 1) * step_tokens / (recs[-1].end - recs[0].end)
    done = {p.peer_id: p.microbatches for p in swarm.peers.values()}
    return {"replica_sync": sync, "seats": seated, "attacker_ids_per_stage": k, "kind": kind,
            "stages_attacked": [2] if one_stage else "every", "honest_per_stage": honest,
            "members_per_stage": honest + k,
            "tokens_per_second": tps, "steps": driver.step, "failed_attempts": driver.failed_attempts,
            "median_step_s": sorted(b.end - a.end for a, b in zip(recs, recs[1:]))[(len(recs) - 1) // 2],
            "median_commit_s": sorted(r.commit_s for r in recs[1:])[(len(recs) - 1) // 2],
            "attacker_microbatches_last_step": sum(v for p, v in done.items() if p.startswith("atk")),
            "microbatches_per_step": microbatches}


def throughput(ks: tuple[int, ...], honest: int, steps: int, seed: int, sync: str, seated: str) -> list[dict]:
    rows = []
    runs = [("bare", k, False) for k in ks] + [("replica", k, False) for k in ks[1:4]] + [("bare", ks[2], True)]
    for kind, k, one_stage in runs:
        if seated == "every member" and honest + k > MAX_GROUP:
            rows.append({"replica_sync": sync, "seats": seated, "attacker_ids_per_stage": k, "kind": kind,
                         "stages_attacked": [2] if one_stage else "every", "honest_per_stage": honest,
                         "members_per_stage": honest + k, "tokens_per_second": 0.0,
                         "not_run": f"more than {MAX_GROUP} members: the reduce command cannot name them (limits)"})
            continue
        t = time.perf_counter()
        row = run_virtual(_swarm(k, kind, honest, steps, seed, one_stage, sync, seated))
        row["wall_s"] = time.perf_counter() - t
        rows.append(row)
        print(f"{sync:8s} {seated:12s} {kind:8s} K={k:3d}{' on stage 2 only' if one_stage else ''}: "
              f"{row['tokens_per_second']:8.0f} tokens/s, step {row['median_step_s']:.1f} s "
              f"(commit {row['median_commit_s']:.1f} s), {row['wall_s']:.0f} s wall", flush=True)
    base = rows[0]["tokens_per_second"]
    for row in rows:
        row["of_clean"] = row["tokens_per_second"] / base
    return rows


def main(out_dir: str, quick: bool = False) -> None:
    import logging
    logging.disable(logging.WARNING)  # every ban is a warning
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ks = (0, 4, 16, 100) if quick else (0, 4, 16, 32, 60, 100, 400)
    result = {"defaults": {"id_work_bits": BITS, "ids_per_network": N, "ids_per_block": M},
              "work": work_rate(), "fielded": fielded(), "limits": limits(),
              "throughput": {"model": "swarm/bench/simulate: large, 4 stages, 3 honest replicas per stage on "
                             "consumer GPUs at 40% MFU, 80 Mbit/s symmetric links, 10-150 ms; replica sync exact (the "
                             "spec default) and powersgd rank 8; attacker ids 1 Gbit/s, 10 ms; 12 microbatches a "
                             "step; 6 steps, the first untimed",
                             "rows": [r for sync in ("exact", "powersgd") for seated in ("work first", "every member")
                                      for r in throughput(ks, 3, 6, 0, sync, seated)]},
              "cpu_s": resource.getrusage(resource.RUSAGE_SELF).ru_utime}
    (out / "identity_budget.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("work", "fielded", "limits")}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], "--quick" in sys.argv[2:])
