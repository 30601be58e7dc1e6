"""What announcements on a stage key cost a reader (docs/security.md, What the record layer does not defend: "A peer's
word about itself"): the time of one directory read of a stage (`SwarmDHT.stage_peers`: every entry's envelope
checked, its signature verified, its announcement parsed) with 3 honest announcements, and with 20 more from fake
ids, each signed by its own Ed25519 identity. The DHT lookup itself is left out (a stand-in returns the entries at
once): this is what the reader's own checks add. Median and range over 200 reads, on this machine as loaded as it is.
Usage: python docs/results/directory_read.py OUT.json"""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from types import SimpleNamespace

from hivemind.utils.timed_storage import get_dht_time

from swarm.dht.envelope import Envelope
from swarm.dht.records import StageAnnouncement, stage_key
from swarm.dht.store import SwarmDHT
from swarm.trust.identity import Identity

READS, RUN, HONEST, FAKES = 200, "0123456789abcdef", 3, 20


class Entries:
    """hivemind's DHT as far as a directory read uses it: the entries under a key, at once."""

    def __init__(self, key: str, ids: list[Identity]) -> None:
        expires = get_dht_time() + 300
        self.value = {}
        for i, ident in enumerate(ids):
            ann = StageAnnouncement(ident.peer_id, RUN, 1, [f"/ip4/203.0.113.{i}/tcp/31337"], 1000.0, 0, 0, "online",
                                    "0.1.0")
            env = Envelope.seal(key, ident.peer_id, ann.to_record(), expires, ident)
            self.value[ident.peer_id] = SimpleNamespace(value=env.to_value(), expiration_time=expires)

    async def get(self, key: str, latest: bool = True, return_future: bool = False):
        return SimpleNamespace(value=self.value)


async def reads(n_ids: int) -> dict:
    dht = SwarmDHT(Entries(stage_key(RUN, 1), [Identity.generate() for _ in range(n_ids)]))
    times = []
    for _ in range(READS):
        t0 = time.perf_counter()
        peers = await dht.stage_peers(RUN, 1)
        times.append(time.perf_counter() - t0)
        assert len(peers) == n_ids
    return {"announcements": n_ids, "median_ms": statistics.median(times) * 1e3, "min_ms": min(times) * 1e3,
            "max_ms": max(times) * 1e3}


def main(out: str) -> None:
    honest, crowded = asyncio.run(reads(HONEST)), asyncio.run(reads(HONEST + FAKES))
    rows = {"reads": READS, "cpus": os.cpu_count(), "load_1min": os.getloadavg()[0], "honest": honest,
            "with_fakes": crowded, "added_median_ms": crowded["median_ms"] - honest["median_ms"],
            "added_per_fake_ms": (crowded["median_ms"] - honest["median_ms"]) / FAKES}
    print(json.dumps(rows, indent=1))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
