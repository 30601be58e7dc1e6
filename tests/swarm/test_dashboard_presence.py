"""Presence: probe verdicts over the rows built from DHT records, with a fake clock (no network)."""
from __future__ import annotations

from swarm.dashboard.presence import MISSES_OFFLINE, OFFLINE_KEEP_S, Presence


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def view(peer: str, state: str = "online", tokens: float = 500.0, age: float = 1.0) -> dict:
    return {"peer_id": peer, "stage": 1, "state": state, "online": state == "online", "tokens_per_s": tokens,
            "age_s": age}


def shown(presence: Presence, *views: dict) -> dict[str, dict]:
    return {r["peer_id"]: r for r in presence.rows(list(views))}


def test_a_peer_that_misses_two_probes_is_offline_at_once_although_its_record_lives():
    clock = Clock()
    presence = Presence(clock)
    rows = shown(presence, view("a"), view("b"))
    assert rows["a"]["online"] and rows["a"]["answers"] is None, "not probed yet: the record says online"

    presence.probed("a", answered=False)
    presence.probed("b", answered=True)
    clock.t += 2
    rows = shown(presence, view("a"), view("b"))
    assert rows["a"]["online"] and rows["a"]["state"] == "online" and rows["a"]["answers"] is False, \
        "one missed probe is not enough (a peer may be busy for a moment)"
    assert rows["b"]["answers"] is True and rows["b"]["online"]

    assert MISSES_OFFLINE == 2
    presence.probed("a", answered=False)
    presence.probed("b", answered=True)
    clock.t += 2
    rows = shown(presence, view("a", age=5.0), view("b"))
    assert rows["a"]["state"] == "offline" and not rows["a"]["online"] and rows["a"]["tokens_per_s"] == 0.0
    assert not rows["a"]["standby"] and rows["a"]["measured_tokens_per_s"] is None, "no standby head once offline"
    assert rows["a"]["answers"] is False and rows["a"]["age_s"] == 5.0 and presence.dead("a")
    assert rows["b"]["online"] and not presence.dead("b")


def test_an_offline_peer_is_back_online_when_it_answers_again():
    clock = Clock()
    presence = Presence(clock)
    shown(presence, view("a"))
    for _ in range(3):
        presence.probed("a", answered=False)
        clock.t += 2
        rows = shown(presence, view("a"))
    assert rows["a"]["state"] == "offline"

    presence.probed("a", answered=True)
    clock.t += 2
    rows = shown(presence, view("a", state="paused"))
    assert rows["a"]["state"] == "paused" and rows["a"]["answers"] is True and not presence.dead("a"), \
        "an answering peer shows what its record says"
    rows = shown(presence, view("a"))
    assert rows["a"]["online"] and rows["a"]["tokens_per_s"] == 500.0


def test_a_peer_whose_records_expire_is_an_offline_row_for_the_documented_time():
    clock = Clock()
    presence = Presence(clock)
    shown(presence, view("a", age=2.0), view("b"))
    clock.t += 10
    rows = shown(presence, view("b"))  # a's records expired
    assert rows["a"]["state"] == "offline" and not rows["a"]["online"] and rows["a"]["tokens_per_s"] == 0.0
    assert rows["a"]["age_s"] == 12.0, "last seen: its record's age then, plus the time since"

    clock.t += OFFLINE_KEEP_S - 10 - 0.5  # went offline when last listed: 0.5 s of its row left
    assert "a" in shown(presence, view("b"))
    clock.t += 1.0
    assert "a" not in shown(presence, view("b")), f"an offline row is dropped after {OFFLINE_KEEP_S:g} s"
    assert "a" not in presence._peers, "nothing is kept of a peer gone for good"


def test_a_dead_peer_whose_record_still_lives_is_dropped_after_the_documented_time_and_stays_offline():
    clock = Clock()
    presence = Presence(clock, keep_s=60.0)
    shown(presence, view("a"))
    for _ in range(2):
        presence.probed("a", answered=False)
    clock.t += 1
    assert shown(presence, view("a"))["a"]["state"] == "offline"  # offline from here
    clock.t += 59.5
    assert shown(presence, view("a"))["a"]["state"] == "offline"
    clock.t += 1.0
    assert "a" not in shown(presence, view("a")), "a long ttl does not keep a dead peer's row"
    presence.probed("a", answered=False)
    clock.t += 30
    assert "a" not in shown(presence, view("a")), "still dead: still hidden, not back as online"

    presence.probed("a", answered=True)  # the same peer id, alive again
    assert shown(presence, view("a"))["a"]["online"]


def test_a_dead_peer_whose_records_then_expire_keeps_its_offline_time():
    clock = Clock()
    presence = Presence(clock, keep_s=60.0)
    shown(presence, view("a"))
    presence.probed("a", answered=False)
    presence.probed("a", answered=False)
    clock.t += 1
    shown(presence, view("a"))  # offline at t=1
    clock.t += 14
    assert shown(presence)["a"]["state"] == "offline"  # records expired at t=15: still the row of t=1
    clock.t += 46  # 60 s after the missed probes, 46 s after the expiry
    assert "a" not in shown(presence), "the row's time counts from the missed probes, not from the expiry"


def test_verdicts_for_peers_no_longer_listed_are_ignored():
    clock = Clock()
    presence = Presence(clock)
    presence.probed("never-listed", answered=False)
    assert shown(presence) == {} and not presence.dead("never-listed")
