"""Tickets for private swarms: issue, travel, check; whom a handler admits; `swarm admit` and `swarm identity`."""
from __future__ import annotations

import logging
import time

import pytest

from protocol.spec import preset
from swarm.cli import main
from swarm.trust.admission import (
    Admission,
    AdmissionError,
    AdmissionPolicy,
    AdmitOptions,
    Ticket,
    issue_ticket,
    parse_duration,
    read_ticket,
)
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey

SWARM = SigningKey.generate()
PEER, OTHER = Identity.generate().peer_id, Identity.generate().peer_id


def test_a_ticket_round_trips_as_text_and_verifies():
    ticket = Ticket.issue(SWARM, PEER, expires=time.time() + 3600)
    text = ticket.encode()
    assert text.startswith("swt1.") and len(text) < 256 and "=" not in text
    back = Ticket.decode(text)
    assert back == ticket and Ticket.from_bytes(ticket.to_bytes()) == ticket
    back.verify(SWARM.public_bytes(), PEER, until=time.time())


@pytest.mark.parametrize("case, words", [
    ("another swarm key", "not this swarm's"),
    ("another peer", "names peer"),
    ("tampered expiry", "not signed by the swarm key"),
    ("expired", "expired"),
])
def test_a_ticket_that_does_not_fit_is_refused(case, words):
    now = time.time()
    good = Ticket.issue(SWARM, PEER, expires=now + 60)
    swarm_key, peer, until, ticket = SWARM.public_bytes(), PEER, now, good
    if case == "another swarm key":
        swarm_key = SigningKey.generate().public_bytes()
    elif case == "another peer":
        peer = OTHER
    elif case == "tampered expiry":
        ticket = Ticket(good.swarm_key, good.peer_id, now + 10**9, good.signature)
    elif case == "expired":
        until = now + 61
    with pytest.raises(AdmissionError, match=words):
        ticket.verify(swarm_key, peer, until)


def test_a_ticket_without_expiry_never_expires():
    Ticket.issue(SWARM, PEER).verify(SWARM.public_bytes(), PEER, until=time.time() + 10**9)


@pytest.mark.parametrize("text", ["", "hello", "swt1.", "swt1.!!!!", "swt1.AAAA", "swt1." + "A" * 2000])
def test_junk_is_not_a_ticket(text):
    with pytest.raises(AdmissionError):
        Ticket.decode(text)


def test_read_ticket_takes_the_text_or_a_file(tmp_path):
    ticket = Ticket.issue(SWARM, PEER)
    (tmp_path / "t").write_text(ticket.encode() + "\n")
    assert read_ticket(ticket.encode()) == ticket and read_ticket(str(tmp_path / "t")) == ticket
    assert read_ticket(None) is None
    with pytest.raises(AdmissionError, match="neither a ticket"):
        read_ticket(str(tmp_path / "missing"))


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("15m", 900), ("12h", 43200), ("30d", 2592000),
                                           ("never", 0), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "-5", "0", "5y", "soon"])
def test_bad_durations_say_how_to_write_one(text):
    with pytest.raises(ValueError, match="15m"):
        parse_duration(text)


def test_the_policy_of_a_spec_and_who_it_admits():
    coordinator = Identity.generate().peer_id
    spec = preset("tiny").replace(coordinator_key=SWARM.public_bytes().hex(),
                                  extra={"private": True, "coordinator_peer": coordinator})
    policy = AdmissionPolicy.for_spec(spec)
    assert policy == AdmissionPolicy(True, SWARM.public_bytes(), coordinator)
    assert AdmissionPolicy.for_spec(preset("tiny")) == AdmissionPolicy()
    assert AdmissionPolicy().check(PEER, None) is None  # public: everyone
    assert policy.check(coordinator, None) is None  # the coordinator needs no ticket
    assert policy.check(PEER, Ticket.issue(SWARM, PEER).to_bytes()).peer_id == PEER
    with pytest.raises(AdmissionError, match="has no ticket.*swarm admit"):
        policy.check(PEER, None)
    with pytest.raises(AdmissionError, match="not a ticket"):
        policy.check(PEER, b"junk")
    with pytest.raises(AdmissionError, match="not known yet"):
        AdmissionPolicy(private=True).check(PEER, Ticket.issue(SWARM, PEER))


def test_admission_remembers_valid_tickets_and_logs_a_refusal_once(caplog):
    admission = Admission(AdmissionPolicy(True, SWARM.public_bytes()))
    assert not admission.learn(OTHER, Ticket.issue(SigningKey.generate(), OTHER).to_bytes())
    assert admission.learn(PEER, Ticket.issue(SWARM, PEER).to_bytes())
    late = Identity.generate().peer_id
    assert admission.learn(late, Ticket.issue(SWARM, late, expires=time.time() + 0.2).to_bytes())
    with caplog.at_level(logging.WARNING, logger="swarm.trust.admission"):
        assert admission.admits(PEER) and admission.admits(late)
        assert not admission.admits(OTHER) and not admission.admits(OTHER)
    assert [r.getMessage() for r in caplog.records].count(
        f"refused peer {OTHER}: peer {OTHER[-8:]} has presented no valid ticket for this private swarm.") == 1
    deadline = time.monotonic() + 5
    while admission.knows(late):  # its ticket runs out
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not admission.admits(late)
    with pytest.raises(AdmissionError):
        admission.check(OTHER, None)
    admission.check(OTHER, Ticket.issue(SWARM, OTHER))  # presented on first contact
    assert admission.admits(OTHER)
    admission.adopt(AdmissionPolicy(True, SigningKey.generate().public_bytes()))  # another swarm: forget them all
    assert not admission.knows(PEER)
    assert Admission().admits(OTHER)  # public swarm


def test_swarm_admit_prints_a_ticket_and_swarm_identity_a_peer_id(tmp_path, capsys):
    key_path, id_path = tmp_path / "swarm.key", tmp_path / "peer.key"
    key = SigningKey.load_or_create(key_path)
    assert main(["identity", str(id_path)]) == 0
    peer = capsys.readouterr().out.strip()
    assert peer == Identity.load_or_create(id_path).peer_id
    before = time.time()
    assert main(["admit", "--key", str(key_path), "--peer-id", peer, "--expires", "1h"]) == 0
    ticket = Ticket.decode(capsys.readouterr().out)
    ticket.verify(key.public_bytes(), peer, until=time.time())
    assert before + 3600 <= ticket.expires <= time.time() + 3600

    assert main(["admit", "--key", str(tmp_path / "nokey"), "--peer-id", peer]) == 2
    assert "no swarm key at" in capsys.readouterr().err
    assert main(["admit", "--key", str(key_path), "--peer-id", "not a peer id!"]) == 2
    assert "is not a peer id" in capsys.readouterr().err
    assert not (tmp_path / "nokey").exists()  # admit never makes a key up
    assert issue_ticket(AdmitOptions(str(key_path), peer, "never")).expires == 0


def test_swarm_admit_finds_the_coordinators_default_key_in_the_state_folder(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    key = SigningKey.load_or_create(state / "swarm.key")  # where `swarm coordinator` keeps it by default
    peer = Identity.load_or_create(tmp_path / "peer.key").peer_id
    assert main(["admit", "--state-dir", str(state), "--peer-id", peer]) == 0
    out = capsys.readouterr()
    Ticket.decode(out.out).verify(key.public_bytes(), peer, until=time.time())
    assert key.fingerprint() in out.err
    assert main(["admit", "--state-dir", str(tmp_path / "empty"), "--peer-id", peer]) == 2
    assert f"no swarm key at {tmp_path / 'empty' / 'swarm.key'}" in capsys.readouterr().err
