"""Read a swarm's state from its dashboard's JSON API and print a short summary.

    swarm dashboard --initial-peers /ip4/.../p2p/12D3KooW... --port 8080     # somewhere
    python3 examples/dashboard_api.py http://127.0.0.1:8080/                   # here
    python3 examples/dashboard_api.py http://127.0.0.1:8080/ --json           # the numbers, for scripts

Standard library only: copy it anywhere. The schema of /api/v1/state is documented in
swarm/dashboard/server.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request


def fetch_state(url: str, timeout: float = 10.0) -> dict:
    with urllib.request.urlopen(url.rstrip("/") + "/api/v1/state", timeout=timeout) as reply:
        return json.load(reply)


def summary(state: dict) -> dict:
    """The figures a volunteer asks first: is every stage covered, who is relayed, how fast, what loss."""
    peers = state.get("peers") or []
    online = [p for p in peers if p.get("online")]
    stages = state.get("stages") or []
    losses = [p["loss"] for p in online if p.get("loss") is not None]
    return {
        "run": (state.get("run") or {}).get("hash"),
        "stages": len(stages),
        "stages_covered": sum(1 for s in stages if s.get("covered")),
        "peers_online": len(online),
        "relayed_peers": sorted(p["peer_id"] for p in online if p.get("reachability") == "relayed"),
        "step": max((p.get("step") or 0 for p in online), default=0),
        "loss": min(losses) if losses else None,
        "tokens_per_s": sum(p.get("tokens_per_s") or 0.0 for p in online if p.get("stage") == 0),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the dashboard's address, e.g. http://127.0.0.1:8080/")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    args = parser.parse_args(argv)
    try:
        state = fetch_state(args.url)
    except (urllib.error.URLError, OSError, ValueError) as e:
        print(f"error: cannot read {args.url}api/v1/state ({e}); is `swarm dashboard` running there?", file=sys.stderr)
        return 1
    s = summary(state)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    print(f"run {s['run']}: {s['stages_covered']}/{s['stages']} stages covered, {s['peers_online']} peers online "
          f"({len(s['relayed_peers'])} relayed), step {s['step']}, loss "
          f"{'n/a' if s['loss'] is None else format(s['loss'], '.3f')}, {s['tokens_per_s']:.0f} tokens/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
