"""What a libp2p identity costs to make with no proof of work (docs/security.md, Identities that cost): the time to
make N Ed25519 identities as the swarm makes one (`Identity.generate`: the key and its peer id), and the keys alone,
best of 3 rounds each (the machine's load is written beside them).
Usage: python docs/results/free_ids.py OUT.json [N]  (N: 5000)"""
from __future__ import annotations

import json
import os
import sys
import time

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from swarm.trust.identity import Identity


def best_of_3(make, n: int) -> list[float]:
    rounds = []
    for _ in range(3):
        t0 = time.perf_counter()
        made = [make() for _ in range(n)]
        rounds.append(time.perf_counter() - t0)
        assert len(made) == n
    return rounds


def main(out: str, n: int = 5000) -> None:
    ids, keys = best_of_3(lambda: Identity.generate().peer_id, n), best_of_3(Ed25519PrivateKey.generate, n)
    rows = {"ids": n, "identities_s": ids, "identities_best_s": min(ids), "keys_only_s": keys,
            "keys_only_best_s": min(keys), "us_per_identity": min(ids) / n * 1e6, "cpus": os.cpu_count(),
            "load_1min": os.getloadavg()[0]}
    print(json.dumps(rows, indent=1))
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:]))
