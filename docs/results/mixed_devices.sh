#!/usr/bin/env bash
# Replicas of a stage on a GPU and on the CPU, as real processes over libp2p (docs/algorithms.md 5.3): a local
# swarm of `tiny`, 2 stages x 3 replicas, each stage's replicas on cuda, cpu and cuda (peers take --devices in the
# order they start: replica 0 of every stage, then replica 1, ...), fp32, 24 steps, exact and powersgd. The
# leader compares the replicas' state hashes every 4th step and logs each replica whose hash differs from its
# stage's majority ("... differs from the one its stage agreed on"); the count of those lines is the result.
# OLD_TREE (optional): a source tree of an earlier commit (`git archive REV | tar -x -C DIR`), run the same way.
# Usage, on the device machine (hivemind and the rest carried as wheels in .whl, see ../shared/gpu/README.md):
#     bash docs/results/mixed_devices.sh OUT [OLD_TREE]
set -uo pipefail
out=$1 old=${2:-}
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl 2>/dev/null
nvidia-smi -L
one() {  # TREE SYNC NAME
  PYTHONPATH="$PWD/.site:$PWD/$1" timeout 95 python3 -m swarm.cli local --preset tiny --stages 2 --replicas 3 \
    --devices cuda,cuda,cpu,cpu,cuda,cuda --dtype fp32 --steps 24 --replica-sync "$2" --no-dashboard \
    --workdir "$out/$3" > "$out/$3.out" 2>&1
  echo "$3 rc=$? odd-replica-warnings=$(cat "$out/$3"/*.log 2>/dev/null | grep -c 'differs from the one')" \
       "last: $(tail -c 240 "$out/$3.out" | tr '\n' ' ')"
}
one . exact new-exact
one . powersgd new-powersgd
if [ -n "$old" ]; then
  one "$old" exact old-exact
  one "$old" powersgd old-powersgd
fi
