#!/usr/bin/env bash
# A GPU peer in Docker: build the image from this repository, then run it with the GPU, a volume
# for its identity and checkpoints (so a restarted container keeps its peer id and stage), and
# the libp2p port published (forward it on your router too and pass --public-ip for direct
# connections; without that the peer is served through a relay).
#   usage: run.sh /ip4/<coordinator ip>/tcp/31337/p2p/12D3KooW... [swarm peer flags]
#   IMAGE=subspace-swarm  NAME=swarm-peer  GPUS=all  PORT=31337  VOLUME=swarm-data  NO_BUILD=1 (skip the build)
#   SWARM_HEALTH_PORT=8081 (the peer's /healthz inside the container; the image's health check follows it)
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 /ip4/<coordinator ip>/tcp/31337/p2p/12D3KooW... [swarm peer flags]" >&2
    exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
image="${IMAGE:-subspace-swarm}"
if [ -z "${NO_BUILD:-}" ]; then
    docker build -t "$image" "$here/../.."
fi
coordinator="$1"
shift
# Ctrl+C or `docker stop` sends SIGTERM: the peer leaves the swarm and saves its checkpoint in the volume
exec docker run --rm --init --name "${NAME:-swarm-peer}" --gpus "${GPUS:-all}" \
    -p "${PORT:-31337}:31337" -v "${VOLUME:-swarm-data}:/data" -e SWARM_HEALTH_PORT \
    "$image" --initial-peers "$coordinator" "$@"
