#!/usr/bin/env bash
# Machine A: start the swarm and keep it running. It prints the address volunteers pass to
# peer.sh ("peers join with: swarm peer --initial-peers /ip4/.../tcp/31337/p2p/12D3KooW...").
# Open TCP $PORT (default 31337) to this machine: peers and relayed peers connect here.
#   PORT=31337  HOST=0.0.0.0
#   STATE_DIR=DIR  where the coordinator's identity (coordinator.id: its address) and the swarm key
#                  (swarm.key: whoever holds it decides the run) are kept across restarts; default:
#                  swarm's per-user state folder, ~/.local/share/subspace-swarm (never this clone)
#   extra flags go to `swarm coordinator`, e.g. --public-ip 203.0.113.7 behind a forwarded port.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/../swarm_env.sh"
if [ -n "${STATE_DIR:-}" ]; then
    set -- --state-dir "$STATE_DIR" "$@"
fi
exec "$swarm" coordinator --run-spec "$here/run.toml" --host-maddrs "/ip4/${HOST:-0.0.0.0}/tcp/${PORT:-31337}" "$@"
