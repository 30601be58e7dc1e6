#!/usr/bin/env bash
# Machine B, C, ...: join the swarm that coordinator.sh started, host one stage, train.
#   usage: peer.sh /ip4/<coordinator ip>/tcp/31337/p2p/12D3KooW... [swarm peer flags]
#   e.g.   peer.sh "$ADDR" --device cuda:0
# No port to open: a peer nobody can dial is served through a relay (slower). With a TCP port
# forwarded to this machine, pass PORT=31338 and --public-ip <your public ip> for full speed.
#   PORT=0 (any)  HOST=0.0.0.0
#   STATE_DIR=DIR  this peer's identity (peer.id), remembered stage and checkpoints; default: swarm's
#                  per-user state folder, ~/.local/share/subspace-swarm (`swarm identity` prints
#                  this peer's id). A second peer on the same machine needs its own STATE_DIR.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 /ip4/<coordinator ip>/tcp/31337/p2p/12D3KooW... [swarm peer flags]" >&2
    exit 2
fi
source "$(cd "$(dirname "$0")" && pwd)/../swarm_env.sh"
coordinator="$1"
shift
state="${STATE_DIR:-$swarm_state}"
mkdir -p -m 700 "$state"
mkdir -p "$state/checkpoints"
# the same identity file keeps this peer's id and stage across restarts; the checkpoint its weights
exec "$swarm" peer --initial-peers "$coordinator" \
    --host-maddrs "/ip4/${HOST:-0.0.0.0}/tcp/${PORT:-0}" \
    --identity "$state/peer.id" --checkpoint-dir "$state/checkpoints" --resume "$@"
