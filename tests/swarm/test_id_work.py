"""Identities that cost (`swarm/trust/work.py`, rule 6 of `swarm/dht/envelope.py`): a proof of work bound to
one peer id and one run, what it costs (counted in hashes, not time), and who refuses records without one."""
from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import statistics
import time

import pytest

from protocol.spec import preset
from swarm.coordinator import CoordinatorOptions, sealed_spec
from swarm.dht import Envelope, StageAnnouncement, SwarmRecordValidator, check_envelope, health_key, stage_key
from swarm.dht.envelope import WorkMissing
from swarm.trust import work
from swarm.trust.admission import AdmissionPolicy
from swarm.trust.identity import Identity
from swarm.trust.keys import SigningKey
from swarm.trust.work import find_proof, leading_zero_bits, proof_for, verify_proof, work_digest
from tests.swarm.test_record_validator import as_stored

RUN, OTHER_RUN = "0123456789abcdef", "fedcba9876543210"
PEER, OTHER = Identity.generate(), Identity.generate()


def mean_hashes(bits: int, trials: int) -> float:
    """Average hashes to find a proof, over `trials` distinct (run, peer) pairs."""
    return statistics.fmean(find_proof(f"{i:016x}", PEER.peer_id, bits)[1] for i in range(trials))


def test_a_proof_is_found_and_verified_for_its_peer_and_run_only():
    nonce, hashes = find_proof(RUN, PEER.peer_id, 16)
    assert hashes == nonce + 1  # every nonce from 0 was tried
    assert leading_zero_bits(work_digest(RUN, PEER.peer_id, nonce)) >= 16
    assert verify_proof(RUN, PEER.peer_id, nonce, 16)
    assert not verify_proof(OTHER_RUN, PEER.peer_id, nonce, 16), "another run's proof"
    assert not verify_proof(RUN, OTHER.peer_id, nonce, 16), "another id's proof"
    for junk in (None, -1, 1 << 64, 1.5, True, b"\0" * 8):
        assert not verify_proof(RUN, PEER.peer_id, junk, 16)
    assert verify_proof(RUN, PEER.peer_id, None, 0), "0 bits: no proof asked"
    assert find_proof(RUN, PEER.peer_id, 0) == (0, 1)


def test_checking_a_proof_is_one_hash(monkeypatch):
    nonce, _ = find_proof(RUN, PEER.peer_id, 12)
    made = []
    real = hashlib.sha256
    monkeypatch.setattr(work.hashlib, "sha256", lambda *a: made.append(1) or real(*a))
    assert verify_proof(RUN, PEER.peer_id, nonce, 12)
    assert len(made) == 1


def test_the_cost_doubles_with_each_bit():
    # a draw is geometric with mean 2^bits (relative sd 1/sqrt(trials)): 400 trials give +-5 %, bounds at 7 sd
    # (at 100 trials they were 3.5 sd, and up a skewed tail: about 1 run in 500 failed)
    means = {bits: mean_hashes(bits, 400) for bits in (6, 9, 12)}
    for bits, mean in means.items():
        assert 0.65 * 2 ** bits < mean < 1.35 * 2 ** bits, (bits, mean)
    assert 8 * 0.5 < means[9] / means[6] < 8 * 2 and 8 * 0.5 < means[12] / means[9] < 8 * 2


def test_many_ids_cost_many_times_one():
    """Issue 20: n fake ids must cost n times one. In hashes: one id costs 2^b on average (a geometric draw),
    and a proof is good for its own id only, so n ids cost n * 2^b: a sum of n draws, about Gamma(n) in units
    of 2^b. With n = 160 its relative sd is 7.9 % and the bounds 0.5 and 1.5 lie 6 sd out (a chance failure
    < 1e-7; with n = 40, as this test first had, 1.5 was only ~3 sd up a skewed tail: 1 run in 400 failed)."""
    bits, n = 10, 160
    ids = [Identity.generate().peer_id for _ in range(n)]
    proofs = {peer: find_proof(RUN, peer, bits) for peer in ids}
    total = sum(hashes for _, hashes in proofs.values())
    assert n * 2 ** bits * 0.5 < total < n * 2 ** bits * 1.5, total
    # a transferable proof would pass for all 39 others; by chance each passes with p = 2^-10, so 4 or more
    # of 39 happen with p < 1e-7
    one_proof_for_all = [verify_proof(RUN, peer, proofs[ids[0]][0], bits) for peer in ids[1:40]]
    assert sum(one_proof_for_all) <= 3, "a proof is not transferable"


def announcement_env(peer: Identity, work_nonce: int | None, run: str = RUN, key: str | None = None) -> Envelope:
    ann = StageAnnouncement(peer.peer_id, run, 1, [], 100.0, 0, 0, "online", "0.1.0")
    return Envelope.seal(key or stage_key(run, 1), peer.peer_id, ann.to_record(), time.time() + 15, peer,
                         work=work_nonce)


def test_the_envelope_rule_refuses_peer_records_without_a_proof():
    bits, policy = 12, AdmissionPolicy(work_bits=12)
    nonce, _ = find_proof(RUN, PEER.peer_id, bits)
    check_envelope(announcement_env(PEER, nonce), time.time(), policy)
    health = Envelope.seal(health_key(RUN), PEER.peer_id, {"step": 1}, time.time() + 15, PEER, work=nonce)
    check_envelope(health, time.time(), policy)  # health records carry it too
    other_run_nonce = next(n for n in range(1 << 20) if verify_proof(OTHER_RUN, PEER.peer_id, n, bits)
                           and not verify_proof(RUN, PEER.peer_id, n, bits))
    other_id_nonce = next(n for n in range(1 << 20) if verify_proof(RUN, OTHER.peer_id, n, bits)
                          and not verify_proof(RUN, PEER.peer_id, n, bits))
    for _what, env in {"no proof": announcement_env(PEER, None),
                       "another run's proof": announcement_env(PEER, other_run_nonce),
                       "another id's proof": announcement_env(PEER, other_id_nonce)}.items():
        with pytest.raises(WorkMissing, match="proof of work for this run"):
            check_envelope(env, time.time(), policy)
    # the coordinator, named in the signed spec, needs none; nor does anyone where the run asks none
    check_envelope(announcement_env(PEER, None), time.time(), AdmissionPolicy(coordinator_peer=PEER.peer_id,
                                                                             work_bits=bits))
    check_envelope(announcement_env(PEER, None), time.time(), AdmissionPolicy())


def test_mixed_versions_a_proof_is_outside_the_signature():
    """A record written with a proof keeps the signature an older node checks; a record without one (an older
    peer) is refused once the run asks for work, and is exactly the old format when it does not."""
    nonce, _ = find_proof(RUN, PEER.peer_id, 8)
    with_proof = announcement_env(PEER, nonce)
    assert with_proof.to_value()["w"] == nonce
    assert with_proof.signing_bytes() == dataclasses.replace(with_proof, work=None).signing_bytes()
    check_envelope(dataclasses.replace(with_proof, work=None), time.time(), AdmissionPolicy())  # still verifies
    assert "w" not in announcement_env(PEER, None).to_value()
    parsed = Envelope.from_entry(PEER.peer_id, with_proof.to_value(), with_proof.expiration)
    assert parsed.work == nonce
    with pytest.raises(ValueError, match="64-bit nonce"):
        Envelope.from_entry(PEER.peer_id, {**with_proof.to_value(), "w": "lots"}, with_proof.expiration)


def test_the_dht_validator_refuses_a_record_without_a_proof_and_says_why(caplog):
    validator = SwarmRecordValidator(AdmissionPolicy(work_bits=12))
    nonce, _ = find_proof(RUN, PEER.peer_id, 12)
    assert validator.validate(as_stored(announcement_env(PEER, nonce)))
    with caplog.at_level(logging.WARNING, logger="swarm.dht.validator"):
        for _ in range(3):
            assert not validator.validate(as_stored(announcement_env(OTHER, None)))
    assert validator.refused == 3 and "carries no proof of work" in validator.reasons[-1]
    assert sum("proof of work" in r.getMessage() for r in caplog.records) == 1, "logged once per peer"


def test_the_run_spec_states_the_cost_and_old_specs_mean_none():
    key = SigningKey.generate()
    spec = sealed_spec(preset("tiny"), key, "12D3KooWcoord", id_work_bits=22, ids_per_network=4)
    assert spec.extra["id_work_bits"] == 22 and spec.extra["ids_per_network"] == 4
    assert AdmissionPolicy.for_spec(spec).work_bits == 22
    assert "id_work_bits" not in sealed_spec(preset("tiny"), key).extra  # 0: written as older coordinators did
    assert AdmissionPolicy.for_spec(preset("tiny")).work_bits == 0
    assert AdmissionPolicy.for_spec(preset("tiny").replace(extra={"id_work_bits": "22"})).work_bits == 0
    assert CoordinatorOptions(preset("tiny")).id_work_bits == 22  # a public swarm's default
    for bad, flag in (({"id_work_bits": -1}, "--id-work-bits"), ({"id_work_bits": 99}, "--id-work-bits"),
                      ({"ids_per_network": -1}, "--ids-per-network")):
        with pytest.raises(ValueError, match=flag):
            CoordinatorOptions(preset("tiny"), **bad).check()


def test_a_peer_computes_its_proof_once_and_keeps_it_beside_its_identity(tmp_path, monkeypatch, caplog):
    identity_file = str(tmp_path / "peer.id")
    peer = Identity.load_or_create(identity_file)
    with caplog.at_level(logging.INFO, logger="swarm.trust.work"):
        proof = asyncio.run(proof_for(identity_file, peer.peer_id, RUN, 10))
    assert proof.valid(RUN, peer.peer_id, 10)
    kept = json.loads((tmp_path / "peer.id.work.json").read_text())
    assert kept[RUN] == {"peer_id": peer.peer_id, "bits": 10, "nonce": proof.nonce}
    assert (tmp_path / "peer.id.work.json").stat().st_mode & 0o077 == 0
    log = "\n".join(r.getMessage() for r in caplog.records)
    assert "computing this peer's proof of work" in log and "found after" in log and "peer.id.work.json" in log

    def no_work(*_):
        raise AssertionError("a restart must not redo the work")
    monkeypatch.setattr(work, "find_proof", no_work)
    assert asyncio.run(proof_for(identity_file, peer.peer_id, RUN, 10)) == proof
    assert asyncio.run(proof_for(identity_file, peer.peer_id, RUN, 0)) is None  # a LAN swarm asks none
    monkeypatch.undo()
    # another run, or more bits than the kept proof has, is computed anew; both runs stay kept
    if not verify_proof(RUN, peer.peer_id, proof.nonce, 16):
        assert asyncio.run(proof_for(identity_file, peer.peer_id, RUN, 16)).valid(RUN, peer.peer_id, 16)
    asyncio.run(proof_for(identity_file, peer.peer_id, OTHER_RUN, 8))
    assert set(json.loads((tmp_path / "peer.id.work.json").read_text())) == {RUN, OTHER_RUN}
    # a kept proof of another identity (a copied file) is not used
    stranger = Identity.generate()
    assert asyncio.run(proof_for(identity_file, stranger.peer_id, RUN, 8)).valid(RUN, stranger.peer_id, 8)
