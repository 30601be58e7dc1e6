#!/usr/bin/env bash
# The GPU runs of `swarm bench scale` behind docs/benchmarks.md "Scaling with GPUs", as run on the
# device machine (torch preinstalled; hivemind and the rest carried as wheels in .whl, see
# ../shared/gpu/README.md). Usage: bash docs/results/scale_gpu.sh PART OUT_DIR [SECONDS]
set -uo pipefail
part=$1 out=$2 budget=${3:-540}
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl 2>/dev/null
export PYTHONPATH="$PWD/.site:$PWD"
nvidia-smi -L
n=$(nvidia-smi -L | wc -l)
all=$(seq -s, -f "cuda:%g" 0 $((n - 1)))
swarm() { timeout "$budget" python3 -m swarm.cli "$@"; }
case $part in
  large)  # one process vs 1 head, 2 heads (pure data parallel), 2 stages, and with 4 GPUs 2x2 and 4 stages
    layouts=1x1,1x2,2x1; [ "$n" -ge 4 ] && layouts=$layouts,2x2,4x1
    swarm bench scale --preset large --layouts "$layouts" --devices "$all" --codec subspace --dtype auto \
        --steps 20 --warmup 5 --replica-sync powersgd --resume --out "$out/scale-large" ;;
  large-exact)  # two heads of the whole large model kept in step exactly: the reduce moves every gradient
    swarm bench scale --preset large --layouts 1x2 --devices cuda:0,cuda:1 --codec subspace --dtype auto \
        --steps 8 --warmup 3 --replica-sync exact --no-baseline --resume --out "$out/scale-large-exact" ;;
  small80)  # small, 3 stages at 80 Mbit/s per host: 1 vs 2 replicas per stage with powersgd, same 2 GPUs
    swarm bench scale --preset small --layouts 3x1,3x2 --devices cuda:0,cuda:1 --codec subspace --dtype auto \
        --steps 40 --warmup 10 --bandwidth 80mbit --replica-sync powersgd --no-baseline --resume \
        --out "$out/scale-small-80mbit" ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
