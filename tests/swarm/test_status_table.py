"""`swarm status`'s table: a peer that did not answer its probe is shown offline and named below."""
from __future__ import annotations

from swarm.monitor.coverage import uncovered_reason
from swarm.monitor.status import format_table

RUN = {"hash": "0123456789abcdef", "name": "tiny", "codec": "subspace", "rank": 16, "stages": 3, "key": "b13c482f"}


def peer(peer_id: str, answers: bool, state: str = "online") -> dict:
    return {"peer": peer_id, "state": state if answers else "offline", "announced_state": state, "answers": answers,
            "throughput": 4000.0, "queue": 1, "basis_version": 0, "age_s": 2.5, "reachability": "direct"}


def test_a_silent_peer_is_offline_and_its_stage_missing():
    table = format_table({"run": RUN, "stages": {0: [peer("12D3KooWHeadHeadHead", True)],
                                                 1: [peer("12D3KooWDeadDeadDead", False)],
                                                 2: []}})
    rows = [line.split() for line in table.splitlines()[2:] if line.split()[0].isdigit()]
    assert rows[0][:4] == ["0", "…adHeadHead", "online", "yes"]
    assert rows[1][:4] == ["1", "…adDeadDead", "offline", "no"]
    assert rows[2] == ["1", "(none)", "MISSING"], "a stage whose only peer is silent is not covered"
    assert rows[3] == ["2", "(none)", "MISSING"]
    assert table.splitlines()[-1].startswith("offline (did not answer a probe") and "…adDeadDead" in table
    assert "answers" in table.splitlines()[1]


def test_the_stages_that_pause_the_swarm_and_why():
    stages = {0: [peer("12D3KooWHeadHeadHead", True, "paused")],
              1: [peer("12D3KooWDeadDeadDead", False), peer("12D3KooWFreshFresh", True, "syncing")], 2: []}
    paused = {s: why for s in range(3) if (why := uncovered_reason(s, [p["state"] for p in stages[s]]))}
    assert sorted(paused) == [1, 2], "a paused head still serves stage 0; a dead peer serves nothing"
    assert "a peer is getting its state" in paused[1] and "until a peer joins it" in paused[2]
    table = format_table({"run": RUN, "stages": stages, "paused": paused})
    assert [line for line in table.splitlines() if line.startswith("paused: ")] == [
        f"paused: {paused[1]}.", f"paused: {paused[2]}."]


def test_no_note_when_every_peer_answers():
    table = format_table({"run": RUN, "stages": {s: [peer(f"12D3KooWPeer{s}Peer{s}", True)] for s in range(3)}})
    assert "MISSING" not in table and "offline" not in table and len(table.splitlines()) == 5


def test_each_peer_s_peak_memory_from_its_health_record_or_a_dash_without_one():
    with_record = {**peer("12D3KooWHeadHeadHead", True), "peak_memory_bytes": 3 * 2**29}
    table = format_table({"run": RUN, "stages": {0: [with_record], 1: [peer("12D3KooWNoRecordNo", True)], 2: []}})
    assert table.splitlines()[1].split()[-2:] == ["peak", "mem"]
    rows = [line.split() for line in table.splitlines()[2:] if line.split()[0].isdigit()]
    assert rows[0][-1] == "1.5G" and rows[1][-1] == "-"


def test_a_standby_head_s_speed_is_marked_measured():
    standby = {**peer("12D3KooWSpareSpare", True), "throughput": 5321.4, "standby": True}
    leader = {**peer("12D3KooWHeadHeadHead", True), "standby": False}
    table = format_table({"run": RUN, "stages": {0: [leader, standby], 1: [peer("12D3KooWPeer1Peer1", True)],
                                                 2: [peer("12D3KooWPeer2Peer2", True)]}})
    rows = [line.split() for line in table.splitlines()[2:] if line.split()[0].isdigit()]
    assert rows[0][5] == "4000" and rows[1][5] == "~5321" and rows[2][5] == "4000"
    assert table.splitlines()[-1].startswith("~N tok/s: a head that does not lead")
    assert "its measured compute speed" in table.splitlines()[-1]


def test_a_revoked_head_and_the_rollback_ordered_for_it_or_that_its_steps_stay_applied():
    stages = {s: [peer(f"12D3KooWPeer{s}Peer{s}", True)] for s in range(3)}
    revoked = [{"head": "12D3KooWEarlyLiarXX", "rollback_to": None, "caught": None},
               {"head": "12D3KooWLateLiarYYY", "rollback_to": 100, "caught": 117}]
    table = format_table({"run": RUN, "stages": stages, "revoked": revoked})
    lines = [line for line in table.splitlines() if line.startswith("head …")]
    assert len(lines) == 2
    assert "…arlyLiarXX lost its lease" in lines[0] and "the steps it drove stay applied" in lines[0]
    assert "…ateLiarYYY lost its lease" in lines[1] and "rolled back to step 100" in lines[1]
    assert "caught at step 117" in lines[1]
