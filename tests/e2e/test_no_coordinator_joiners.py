"""Who joins a swarm that has no coordinator at all (issue 56), in real processes over libp2p: a private 2-stage
swarm (every peer holds a ticket) whose coordinator signs records that live only 5 s in the DHT (`--record-ttl 5`).
The coordinator is stopped and the test waits until the DHT holds neither its run spec nor its lease. Then:

- a private swarm's newcomer (stage 1) is served the records by the peers with the ticket in its requests, and
  joins; `swarm unban` (the swarm key's holder) gets the spec from the peers the same way and signs its pardon,
  and so do `swarm status` and `swarm dashboard` with an identity and ticket of their own (`--identity
  --ticket`), while status without them says in one sentence why it found no spec;
- a head that joins then is in no lease, so it never leads: once the only head of the lease is killed, it waits,
  saying so, and drives no step;
- a standby coordinator started then reads the run spec from the peers (it signs itself a ticket), takes the seat,
  and puts that head in the lease: it leads, and training goes on.

One swarm serves every assert (the suite must stay fast): tests/e2e/test_no_coordinator.py shows the public
swarm's newcomer, the basis chain and the failover between heads of the lease."""
from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import pytest

from protocol.spec import RunSpec, preset
from swarm.dht import RUN_KEY, SwarmDHT, close_node, lease_key, start_dht
from swarm.local import LocalOptions, LocalSwarm
from swarm.monitor.reader_ticket import ReaderTicket
from swarm.monitor.status import format_table, swarm_state
from swarm.trust.admission import Ticket
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from swarm.unban_command import UnbanOptions, unban
from tests.e2e.conftest import wait_for_event, wait_for_steps
from tests.e2e.processes import sigkill_and_wait_for_group
from tests.e2e.test_dashboard import free_port, get

STEPS = "100000"  # the heads never finish: the test stops them
RECORD_TTL = 5
PEERS = ("stage0", "stage1", "newcomer", "third", "monitor", "dashboard")  # the last two: the operator's tools
LIAR = "12D3KooW" + "L" * 44


def _log(swarm: LocalSwarm, name: str) -> str:
    path = swarm.dir / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


async def _poll(what: str, check, timeout: float):
    """Await `check()` until it returns something true; fail naming `what` at the deadline."""
    deadline = time.monotonic() + timeout
    while not (found := await check()):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s")
        await asyncio.sleep(0.3)  # poll interval of the DHT and of logs other processes write
    return found


def _said(swarm: LocalSwarm, name: str, pattern: str):
    async def check():
        return re.search(pattern, _log(swarm, name))
    return check


async def test_without_any_coordinator_a_ticket_holder_joins_a_new_head_never_leads_and_a_standby_reads_the_peers(
        tmp_path):
    key_file = tmp_path / "swarm.key"
    key = SigningKey.load_or_create(key_file)
    ids = {name: Identity.load_or_create(tmp_path / f"{name}.id") for name in PEERS}
    tickets = {name: ["--identity", str(tmp_path / f"{name}.id"), "--ticket",
                      Ticket.issue(key, ids[name].peer_id, time.time() + 3600).encode()] for name in PEERS}
    swarm = LocalSwarm(LocalOptions(preset("tiny", stages=2), steps=int(STEPS), workdir=str(tmp_path / "run"),
                                    threads=1, quiet=True, record_ttl=RECORD_TTL, coordinator_key=str(key_file),
                                    extra_peer_args=["--ttl", "6"]))
    swarm.head_names = lambda: ["stage0", "third"]  # whose reports hold the steps
    dht = None
    try:
        await asyncio.to_thread(swarm.start_coordinator, "--private")
        swarm.start_peer(0, "--steps", STEPS, *tickets["stage0"])
        swarm.start_peer(1, *tickets["stage1"])
        stage1 = (await asyncio.to_thread(wait_for_event, swarm, "stage1", "ready"))[0]["maddrs"]
        await asyncio.to_thread(wait_for_steps, swarm, 2)

        # a reader in the test process: what the DHT itself holds (it asks no peer)
        dht = await asyncio.to_thread(start_dht, stage1, ["/ip4/127.0.0.1/tcp/0"], None, True)
        reader = SwarmDHT(dht)
        run = RunSpec.from_json((await reader.fetch_run_spec(key.public_bytes())).spec_json)
        await reader.adopt(run)

        async def lease_names(peer: str):
            lease = await reader.fetch_lease(run.run_hash)
            return lease is not None and peer in lease.order
        await _poll("the lease never named the first head", lambda: lease_names(ids["stage0"].peer_id), 60)

        coordinator = dict(swarm.procs)["coordinator"]
        coordinator.send_signal(signal.SIGTERM)
        await asyncio.to_thread(coordinator.wait, 30)
        swarm.procs = [(n, p) for n, p in swarm.procs if n != "coordinator"]  # gone on purpose

        async def expired():  # the entries themselves: a reader's fetch_lease gives the lease it holds
            return not any([(await reader.entries(k))[0] for k in (RUN_KEY, lease_key(run.run_hash))])
        await _poll("the coordinator's records never expired from the DHT", expired, RECORD_TTL + 30)

        swarm.maddrs = stage1  # newcomers know a peer's address, not the (dead) coordinator's
        swarm.start_peer(1, *tickets["newcomer"], name="newcomer")
        swarm.start_peer(0, "--steps", STEPS, *tickets["third"], name="third")
        # meanwhile, the operator's tools: status without a ticket and with one, and a dashboard with one
        url_file = tmp_path / "dashboard.json"
        swarm.spawn("dashboard", ["dashboard", "--initial-peers", *stage1, "--port", str(free_port()),
                                  "--url-file", str(url_file), *tickets["dashboard"]])
        state = await swarm_state(stage1)
        admitted = await swarm_state(stage1, ReaderTicket(ids["monitor"], Ticket.decode(tickets["monitor"][-1])))
        pardoned = await unban(UnbanOptions(stage1, str(key_file), peers=[LIAR]))
        for name in ("newcomer", "third"):
            await asyncio.to_thread(wait_for_event, swarm, name, "ready", 120)

        async def dashboard_run():
            if not url_file.exists():
                return None
            return json.loads((await asyncio.to_thread(get, json.loads(url_file.read_text())["url"] +
                                                       "api/v1/state"))[1])["run"]
        shown = await _poll("the dashboard with a ticket never showed the run", dashboard_run, 60)

        await asyncio.to_thread(sigkill_and_wait_for_group, dict(swarm.procs)["stage0"])
        swarm.procs = [(n, p) for n, p in swarm.procs if n != "stage0"]
        waits = _said(swarm, "third", r"no live head holds the coordinator's lease yet \(lease: ([^)]*)\)")
        waiting = await _poll("the new head never said it waits for a head of the lease", waits, 60)
        steps_leaderless = len(swarm.step_events()[0])
        seat_empty_until = time.time()  # the peers' reports stamp events with this clock (same machine)

        swarm.spawn("standby", ["coordinator", "--standby", "--initial-peers", stage1[0], "--key", str(key_file),
                                "--state-dir", str(tmp_path / "standby"), "--host-maddrs", "/ip4/127.0.0.1/tcp/0"])
        await _poll("the standby never took the seat", _said(swarm, "standby", "this coordinator holds the seat"), 90)
        await _poll("the new head never entered the lease", lambda: lease_names(ids["third"].peer_id), 60)
        await asyncio.to_thread(wait_for_steps, swarm, steps_leaderless + 2, 90)
    finally:
        if dht is not None:
            await close_node(dht)
        await asyncio.to_thread(swarm.stop, 5.0)

    newcomer, third, standby = (_log(swarm, n) for n in ("newcomer", "third", "standby"))
    assert "got the run spec from peer" in newcomer and "got the leader lease from peer" in newcomer, newcomer[-3000:]
    assert [e for e in swarm.events("newcomer") if e["event"] == "joined"], "the newcomer downloaded no state"
    assert state["run"] is None and "re-serve it to ticket holders only" in format_table(state)
    assert admitted["run"] is not None and admitted["run"]["hash"] == run.run_hash, admitted
    assert shown["hash"] == run.run_hash and "got the run spec from peer" in _log(swarm, "dashboard")
    assert {p["peer"] for p in admitted["stages"][1]} >= {ids["stage1"].peer_id}, admitted["stages"]
    assert pardoned == 0, "swarm unban could not read the run spec from the peers"
    assert ids["third"].peer_id[-8:] not in waiting.group(1), f"the new head is in the lease: {waiting.group(0)}"
    driven = [e for e in swarm.events("third") if e["event"] == "step"]
    # by time, not step number: a step the killed leader had not finished is driven again (a later attempt)
    # once the standby leases the new head, and that is the run going on as it should
    assert not any(e["time"] <= seat_empty_until for e in driven), f"the new head led with no coordinator: {driven}"
    assert "got the run spec from peer" in standby, f"the standby did not read the spec from the peers\n{standby}"
    assert driven, f"the new head never led once the standby held the seat\n--- third\n{third[-3000:]}"
