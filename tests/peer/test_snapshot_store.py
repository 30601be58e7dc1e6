"""The snapshot store keeps what matches its sha256, the newest per stage, within its bounds;
snapshot messages refuse what is malformed."""
from __future__ import annotations

import pytest

from peer.state.snapshot_store import Snapshot, SnapshotRefused, SnapshotStore, sha256_hex
from protocol.snapshot_wire import (
    SnapshotInfo,
    SnapshotList,
    SnapshotRequest,
    decode_snapshot_list,
    decode_snapshot_request,
    encode_snapshot_list,
    encode_snapshot_request,
    n_chunks,
)
from protocol.wire import WireError


def snap(stage: int, step: int, data: bytes | None = None) -> Snapshot:
    data = data if data is not None else f"stage {stage} at {step}".encode()
    return Snapshot(stage, step, sha256_hex(data), data)


def test_a_snapshot_whose_bytes_do_not_match_its_sha256_is_refused():
    store = SnapshotStore(lambda s: 1000)
    with pytest.raises(SnapshotRefused, match="does not match its sha256"):
        store.put(Snapshot(1, 2, sha256_hex(b"honest"), b"forged"))
    assert store.listed(1) == [] and store.nbytes == 0


def test_the_newest_snapshots_are_kept_and_memory_stays_bounded():
    store = SnapshotStore(lambda s: 100, keep=2)
    for step in (2, 4, 6):
        assert store.put(snap(1, step))
    assert [i.step for i in store.listed(1)] == [6, 4]  # the oldest went
    assert store.newest(1).step == 6 and store.get(1, 2) is None
    assert not store.put(snap(1, 2)) and not store.wants(1, 2)  # older than everything kept
    assert store.wants(1, 8) and not store.wants(1, 6)
    with pytest.raises(SnapshotRefused, match="larger than"):
        store.put(snap(1, 8, b"x" * 101))
    store = SnapshotStore(lambda s: 100, keep=2)
    for stage in range(3):
        for step in range(10):
            store.put(snap(stage, step, bytes([step]) * 100))
    assert store.nbytes == 3 * 2 * 100  # keep x stages x the largest a stage's snapshot can be


def test_a_second_different_snapshot_of_the_same_step_is_refused():
    store = SnapshotStore(lambda s: 100)
    assert store.put(snap(0, 4, b"first"))
    assert store.put(snap(0, 4, b"first"))  # the same one again: fine
    with pytest.raises(SnapshotRefused, match="held already"):
        store.put(snap(0, 4, b"other"))
    assert store.get(0, 4).data == b"first"


def test_snapshot_messages_round_trip_and_refuse_what_is_malformed():
    offer = SnapshotRequest("run", "offer", 2, 50, 0, "c" * 64, 123)
    assert decode_snapshot_request(encode_snapshot_request(offer), "run", 3, 1000) == offer
    with pytest.raises(WireError, match="another run"):
        decode_snapshot_request(encode_snapshot_request(offer), "other", 3, 1000)
    with pytest.raises(WireError, match="stage"):
        decode_snapshot_request(encode_snapshot_request(offer), "run", 2, 1000)
    with pytest.raises(WireError, match="size"):
        decode_snapshot_request(encode_snapshot_request(offer), "run", 3, 100)
    with pytest.raises(WireError, match="sha256"):
        decode_snapshot_request(encode_snapshot_request(SnapshotRequest("run", "offer", 0, 1, 0, "XYZ", 1)), "run", 3,
                                1000)
    listed = SnapshotList(7, [SnapshotInfo(6, "d" * 64, 10), SnapshotInfo(4, "e" * 64, 10)], True)
    assert decode_snapshot_list(encode_snapshot_list(listed), 100) == listed
    with pytest.raises(WireError, match="size"):
        decode_snapshot_list(encode_snapshot_list(listed), 5)
    assert n_chunks(0, 8) == 1 and n_chunks(8, 8) == 1 and n_chunks(9, 8) == 2
