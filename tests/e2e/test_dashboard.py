"""The dashboard against a live local swarm (coordinator + 3 peers + `swarm dashboard`, tiny preset).

One swarm serves the whole module, in order: the JSON API and /metrics match what the peers
publish; forged health records are refused by the swarm's DHT nodes, and malformed ones that
their writer signed are ignored and counted by the dashboard; a
real headless Chromium shows the stages, a growing loss chart, and a killed peer going
offline; finally the swarm stops and the TensorBoard event files of the head, the tail and the
dashboard are read back.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import swarm as swarm_package
from protocol.spec import preset
from swarm.dht import Envelope, SwarmDHT, health_key, start_dht, stop_dht
from swarm.local import LocalOptions, LocalSwarm
from swarm.monitor.health import fetch_health, parse_health
from swarm.trust.identity import Identity
from tests.e2e.conftest import wait_for_event
from tests.swarm.test_health import record

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SCREENSHOT = Path(swarm_package.__file__).parent / "dashboard" / "screenshot.png"
# a mark (not only the skip inside page_of) so that pytest's -rs summary lists each browser test on its own line
needs_chromium = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"browser test: no Chromium at {CHROMIUM}; "
                                    "install it with apt-get install -y chromium (as .ci/run does)")
RECORD_TTL = 30.0  # the peers' --ttl: a dead peer's records live on 20 to 30 s (refreshed every ttl/3)
OFFLINE_WITHIN_S = 12.0  # a killed peer shows offline within this (probes), well before its records expire


@dataclass
class Live:
    swarm: LocalSwarm
    url: str
    health_ports: dict[int, int]
    tensorboard: dict[str, Path]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def state(live: Live) -> dict:
    status, body = get(live.url + "api/v1/state")
    assert status == 200
    return json.loads(body)


def eventually(check, timeout: float, what: str):
    """Poll `check()` until it returns something truthy; fail with `what` and the last value at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout:g} s (last: {result!r})")
        time.sleep(0.3)  # poll interval of the dashboard's API


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    swarm = LocalSwarm(LocalOptions(preset("tiny", stages=3), workdir=str(tmp / "swarm"), threads=1, quiet=True))
    try:
        swarm.start_coordinator(serving=False)
        ports = {s: free_port() for s in range(3)}
        tb = {name: tmp / f"tb-{name}" for name in ("head", "tail", "dashboard")}
        ttl = ("--ttl", f"{RECORD_TTL:g}")
        swarm.start_peer(0, "--steps", "100000", "--health-port", str(ports[0]), "--tensorboard", str(tb["head"]),
                         *ttl)
        swarm.start_peer(1, "--health-port", str(ports[1]), *ttl)
        swarm.start_peer(2, "--health-port", str(ports[2]), "--tensorboard", str(tb["tail"]), *ttl)
        url = swarm.start_dashboard(0, "--tensorboard", str(tb["dashboard"]))
        wait_for_event(swarm, "stage0", "step", count=2)
        yield Live(swarm, url, ports, tb)
    finally:
        swarm.stop(grace=10.0)


def all_stages_reporting(live: Live) -> dict | None:
    snap = state(live)
    online = [p for p in snap["peers"] if p["online"] and p["health"] and p.get("step", 0) > 0]
    return snap if len(online) == 3 and [s["peers"] for s in snap["stages"]] == [1, 1, 1] else None


@contextmanager
def dht_client(live: Live):
    dht = start_dht(live.swarm.maddrs, ["/ip4/127.0.0.1/tcp/0"], None, True)
    try:
        yield SwarmDHT(dht)
    finally:
        stop_dht(dht)


@contextmanager
def page_of(live: Live):
    """A real headless Chromium on the dashboard; skips with the reason if there is none."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (CI installs it: apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright for Python is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            errors: list[str] = []  # script errors, and console errors such as CSP violations or 404s
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.goto(live.url)
            page.wait_for_selector("body[data-ready='1']", timeout=20_000)
            yield page
            assert not errors, f"the page reported errors: {errors}"
        finally:
            browser.close()


# ---------------------------------------------------------------------------------------------- API

async def test_api_state_matches_the_records_the_peers_publish(live):
    snap = await asyncio.to_thread(eventually, lambda: all_stages_reporting(live), 40, "three reporting stages")
    assert snap["run"]["stages"] == 3 and snap["run"]["name"] == "tiny" and snap["error"] is None
    assert snap["wire"]["compression_ratio"] > 1 and snap["wire"]["forward_bytes_per_token"] > 0

    with dht_client(live) as sdht:  # the records themselves, read by an independent client
        deadline = time.monotonic() + 30
        while True:
            raw = await fetch_health(sdht, snap["run"]["hash"])
            records = {r.peer_id: r for r in (parse_health(k, v, x).record for k, v, x in raw)}
            api = {p["peer_id"]: p for p in state(live)["peers"] if p["online"]}
            same = set(records) == set(api) and all(
                (api[p]["step"], api[p]["basis_version"], api[p]["tokens_per_s"], api[p]["loss"], api[p]["stage"])
                == (r.step, r.basis_version, r.tokens_per_s, r.loss, r.stage) for p, r in records.items())
            if same:
                break
            assert time.monotonic() < deadline, f"the API never matched the DHT's records: {api} vs {records}"
            await asyncio.sleep(0.3)  # the dashboard samples every second, the peers publish every RECORD_TTL / 3
    assert sorted(r.stage for r in records.values()) == [0, 1, 2]
    assert records[next(p for p, r in records.items() if r.stage == 0)].loss is not None

    for stage, port in live.health_ports.items():  # /healthz of each peer agrees, and is ahead or level
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        healthz = json.loads(body)
        assert status == 200 and healthz["state"] == "online" and healthz["stage"] == stage
        assert healthz["run"] == snap["run"]["hash"]
        assert healthz["step"] >= api[healthz["peer_id"]]["step"] and api[healthz["peer_id"]]["stage"] == stage


def test_metrics_parse_and_match_the_api(live):
    def consistent():
        status, text = get(live.url + "metrics")
        snap = state(live)
        values = {}
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                values[(s.name, s.labels.get("peer"))] = s.value
        peers = [p for p in snap["peers"] if p["online"]]
        # the wire figures exist once the head has sent an activation (this test may be the module's first)
        ok = status == 200 and len(peers) == 3 and (snap["wire"] or {}).get("forward_bytes_per_token") and all(
            values.get(("swarm_peer_step", p["peer_id"])) == p["step"]
            and values.get(("swarm_peer_basis_version", p["peer_id"])) == p["basis_version"]
            and values.get(("swarm_peer_tokens_per_second", p["peer_id"])) == pytest.approx(p["tokens_per_s"])
            for p in peers)
        return values if ok else None

    values = eventually(consistent, 20, "/metrics matching /api/v1/state")
    assert values[("swarm_stages", None)] == 3 and values[("swarm_stages_covered", None)] == 3
    assert values[("swarm_peers", None)] == 3 and values[("swarm_invalid_records", None)] == 0
    assert values[("swarm_compression_ratio", None)] > 1


# ---------------------------------------------------------------------------------------------- the page

def stage_peers(page) -> list[str]:
    return [page.get_attribute(f"#stages .stage >> nth={i}", "data-peers")
            for i in range(page.locator("#stages .stage").count())]


def chart_points(page) -> int:
    return int(page.get_attribute("#loss-chart", "data-points"))


@needs_chromium
def test_page_shows_three_stages_and_a_growing_loss_chart(live, tmp_path):
    # The page runs under its own Content-Security-Policy (no eval), so the test reads it through
    # locators and polls from Python rather than evaluating functions inside it.
    with page_of(live) as page:
        eventually(lambda: stage_peers(page) == ["1", "1", "1"], 30, "three stages of one peer each")
        assert page.locator("#peers tbody tr[data-state='online']").count() == 3
        assert "tiny" in page.inner_text("#run-name")
        points = eventually(lambda: chart_points(page), 30, "points on the loss chart")
        eventually(lambda: chart_points(page) > points, 30, "the loss chart growing")
        assert page.locator("#loss-chart canvas").count() == 1, "uPlot drew no chart"
        assert page.inner_text("#card-ratio").endswith("×")
        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        if not SCREENSHOT.exists() or os.environ.get("SWARM_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(tmp_path / "dashboard.png", SCREENSHOT)  # the README's picture
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000


# ---------------------------------------------------------------------------------------------- forgeries

@contextmanager
def attacker_node(live: Live):
    """A bare hivemind node without the swarm's validator: it writes whatever it likes."""
    import hivemind
    dht = hivemind.DHT(initial_peers=live.swarm.maddrs, host_maddrs=["/ip4/127.0.0.1/tcp/0"], client_mode=True,
                       start=True)
    try:
        yield dht
    finally:
        stop_dht(dht)


async def test_forged_health_records_are_refused_and_malformed_ones_ignored_and_counted(live):
    await forge_and_check(live)


async def forge_and_check(live) -> None:
    """Forged and malformed health records against the live swarm: refused, or ignored and counted."""
    snap = state(live)
    run, before = snap["run"]["hash"], snap["invalid_records"]
    key = health_key(run)
    victim = next(p["peer_id"] for p in snap["peers"] if p["online"] and p["stage"] == 1)

    def sealed(signer: Identity, subkey: str, expires: float, body: dict | str) -> dict:
        return Envelope.seal(key, subkey, body, expires, signer).to_value()

    def body(peer: str, **fields) -> dict:  # fields may be invalid: set after the record is built
        return asdict(record(peer, run_hash=run, stage=2, timestamp=time.time())) | fields

    forger = Identity.generate()
    now = time.time()
    forged = {  # records no honest node may store: each names the victim, or is not what it claims
        "signed by another key": (victim, sealed(forger, victim, now + 9, body(victim, step=999999)), now + 9),
        "a bad signature": (forger.peer_id, {**sealed(forger, forger.peer_id, now + 9, body(forger.peer_id)),
                                             "s": bytes(64)}, now + 9),
        "not an envelope": (victim, body(victim, step=999999), now + 9),
        "a far expiry": (forger.peer_id, sealed(forger, forger.peer_id, now + 86400, body(forger.peer_id)),
                         now + 86400),
    }
    # Malformed records signed by their own writer: the DHT keeps them (the body is the writer's
    # business), the dashboard's book refuses and counts each once.
    junk_bodies = [
        body("12D3KooWSomeoneElse"),  # under the writer's id, naming another peer
        {k: v for k, v in body("x").items() if k != "step"},
        "<script>alert(1)</script>",
        body("x", run_hash="0" * 16),
        body("x", tokens_per_s=-1.0),
        body("x", state="hacked"),
        body("x", stage=-1),
    ]
    with attacker_node(live) as attacker, dht_client(live) as sdht:
        for junk in junk_bodies:  # first: so the attacker's stores do reach the swarm's nodes
            writer = Identity.generate()
            # they must outlive the dashboard's reads on a loaded machine (with 30 s they expired unread once)
            expiry = time.time() + 120
            value = sealed(writer, writer.peer_id, expiry, junk if isinstance(junk, str) else
                           {**junk, "peer_id": junk["peer_id"] if junk["peer_id"] != "x" else writer.peer_id})
            assert await attacker.store(key, value, expiry, subkey=writer.peer_id, return_future=True)

        for what, (subkey, value, expires) in forged.items():
            stored = await attacker.store(key, value, expires, subkey=subkey, return_future=True)
            assert not stored, f"an honest DHT node stored a record with {what}"
        raw = {k: (v, x) for k, v, x in await fetch_health(sdht, run)}
        genuine, expires = raw[victim]  # the victim's own record, replayed to live an hour longer
        assert not await attacker.store(key, genuine, expires + 3600, subkey=victim, return_future=True)

        def counted():
            snap = state(live)
            seen = {p["peer_id"]: p for p in snap["peers"]}
            assert all(p.get("step") != 999999 for p in snap["peers"]), "a forged record reached the API"
            assert seen[victim]["online"] and seen[victim]["stage"] == 1
            return snap if snap["invalid_records"] == before + len(junk_bodies) else None

        snap = await asyncio.to_thread(eventually, counted, 60, f"{len(junk_bodies)} more invalid records")
        samples = snap["updated"]
        await asyncio.to_thread(eventually, lambda: state(live)["updated"] > samples + 2, 15, "three more samples")
        after = state(live)
    assert after["invalid_records"] == before + len(junk_bodies), "the same bad entries were counted again"
    shown = {p["peer_id"] for p in after["peers"]}
    assert "12D3KooWSomeoneElse" not in shown and forger.peer_id not in shown, "an invalid record shows as a peer"
    assert sum(p["online"] for p in after["peers"]) == 3 and after["error"] is None, "the forgeries broke the API"
    assert any("another peer's id" in p for p in after["problems"])
    status, text = get(live.url + "metrics")
    assert status == 200 and f"swarm_invalid_records {float(after['invalid_records'])}" in text.decode()


# ---------------------------------------------------------------------------------------------- the page, again

@needs_chromium
def test_page_hides_forgeries_and_shows_a_killed_peer_going_offline(live):
    # under `-n 2` the tests of this module may run in two workers, each with its own swarm (and a module
    # fixture is rebuilt when another module's tests come between): forge here where no test has yet
    if state(live)["invalid_records"] < 7:
        asyncio.run(forge_and_check(live))
    with page_of(live) as page:
        eventually(lambda: stage_peers(page) == ["1", "1", "1"], 30, "three stages of one peer each")
        text = page.inner_text("body")  # nothing the previous test forged made it onto the page
        assert "999,999" not in text and "SomeoneElse" not in text and "<script>" not in text
        assert int(page.inner_text("#card-invalid")) >= 7

        victim = next(p["peer_id"] for p in state(live)["peers"] if p["online"] and p["stage"] == 1)
        proc = dict(live.swarm.procs)["stage1"]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        row = page.locator(f"#peers tbody tr[data-peer='{victim}']")

        def offline() -> bool:  # the dashboard probes every ~2 s: two missed probes, not the record's expiry
            return (row.count() == 1 and row.get_attribute("data-state") == "offline"
                    and page.get_attribute("#stages .stage[data-stage='1']", "data-peers") == "0")

        eventually(offline, OFFLINE_WITHIN_S, "the killed peer offline on the page (its records live on)")
        assert page.locator(f"#banned tbody tr[data-peer='{victim}']").count() >= 1
        assert "uncovered" in page.inner_text("#stages .stage[data-stage='1']")
        seen = {p["peer_id"]: p for p in state(live)["peers"]}
        assert seen[victim]["answers"] is False and not seen[victim]["online"]
        assert all(p["state"] != "offline" for p in seen.values() if p["peer_id"] != victim), "a live peer is offline"


# ---------------------------------------------------------------------------------------------- TensorBoard

def scalars(directory: Path, tag: str) -> list[tuple[int, float]]:
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_tensorboard_files_of_head_tail_and_dashboard(live):
    # what is asserted below needs 3 steps seen by the dashboard (so by the head): on a loaded machine the
    # swarm may not have trained them yet when this test comes
    eventually(lambda: len(state(live)["series"]["loss"]["step"]) >= 3, 120, "the dashboard's loss series has 3 steps")
    live.swarm.stop(grace=15.0)  # peers and the dashboard close (flush) their event files as they leave
    reported = {e["step"]: e["loss"] for e in live.swarm.events(0) if e["event"] == "step"}
    head = scalars(live.tensorboard["head"], "loss")
    assert [s for s, _ in head] == sorted(reported)[: len(head)] and len(head) >= 3
    assert all(v == pytest.approx(reported[s], rel=1e-6) for s, v in head)
    assert len(scalars(live.tensorboard["head"], "wire_bytes_per_token")) == len(head)

    tail = scalars(live.tensorboard["tail"], "loss")
    steps = [s for s, _ in tail]
    assert len(tail) >= 3 and steps == sorted(set(steps)) and all(0 < v < 10 for _, v in tail)
    assert all(v > 0 for _, v in scalars(live.tensorboard["tail"], "tokens_per_s"))

    dash = scalars(live.tensorboard["dashboard"], "swarm/loss")
    assert len(dash) >= 3 and [s for s, _ in dash] == sorted({s for s, _ in dash})
    assert all(v == pytest.approx(reported[s], rel=1e-6) for s, v in dash)
    assert max(v for _, v in scalars(live.tensorboard["dashboard"], "swarm/stages_covered")) == 3
