#!/usr/bin/env bash
# Train on your own text: every *.txt, *.md and *.py file under a folder (recursively), with a
# whole swarm on this machine. Prints the loss going down and the bytes per token on the wire.
#   usage: train.sh FOLDER [swarm local flags]
#   e.g.   train.sh ~/notes --steps 500 --preset small --device cuda
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
    echo "usage: $0 FOLDER [swarm local flags]   (FOLDER holds .txt/.md/.py files)" >&2
    exit 2
fi
source "$(cd "$(dirname "$0")" && pwd)/../swarm_env.sh"
folder="$1"
shift
exec "$swarm" local --data "$folder" --steps "${STEPS:-200}" "$@"
