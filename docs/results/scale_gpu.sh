#!/usr/bin/env bash
# The GPU runs of `swarm bench scale` behind docs/benchmarks.md "Scaling with GPUs", as run on the
# device machine (torch preinstalled; hivemind and the rest carried as wheels in .whl, see
# ../shared/gpu/README.md). Each layout is its own invocation with its own time limit (a layout
# that runs out of it keeps the steps it did, marked incomplete); --resume
# adds it to the JSON (a JSON from an earlier session, copied to OUT/NAME/scale.json, is resumed).
# Usage: bash docs/results/scale_gpu.sh PART OUT_DIR [SECONDS_PER_LAYOUT]
# LAYOUTS=1x1,2x1 (say) runs those layouts of PART only; BATCH=512 (say) sets the sequences a step of
# the batch and small80 parts; REPEAT=3 (say) runs 3 rounds of them all, interleaved (--repeat: the JSON
# then gives medians and each layout's spread between rounds).
set -uo pipefail
part=$1 out=$2 limit=${3:-110}
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl 2>/dev/null
export PYTHONPATH="$PWD/.site:$PWD"
nvidia-smi -L
n=$(nvidia-smi -L | wc -l)
all=$(seq -s, -f "cuda:%g" 0 $((n - 1)))
layouts() {  # NAME LAYOUTS FLAGS...: one invocation per layout
    local name=$1 list=${LAYOUTS:-$2}; shift 2
    for round in $(seq 1 "${REPEAT:-1}"); do  # round r of each layout (and of the one-process run) in turn
        for l in ${list//,/ }; do
            timeout $((limit + 90)) python3 -m swarm.cli bench scale --layouts "$l" --repeat "$round" --resume \
                --out "$out/$name" --layout-limit "$limit" "$@" \
                2>&1 | grep -v "^WARNING" | grep -E "tok/s|_over_|Error|error" | grep -v "_over_1x1\|_over_2x1\|_over_3x1"
            echo "== $name $l round $round exit ${PIPESTATUS[0]}"
            # a peer of the layout still on a card would slow the next layout: say so
            nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/still on a GPU: /'
        done
    done
}
case $part in
  large)  # one process vs 1 head, 2 stages, 2 heads (pure data parallel), and with 4 GPUs 4 stages and 2x2
    list=1x1,2x1,1x2; [ "$n" -ge 4 ] && list=1x1,2x1,4x1,1x2,2x2
    layouts scale-large "$list" --preset large --devices "$all" --codec subspace --dtype auto --steps 12 \
        --warmup 4 --replica-sync powersgd ;;
  heads)  # the whole large model in one stage: one head against two (pure data parallel)
    layouts scale-large "1x1,1x2" --preset large --devices "$all" --codec subspace --dtype auto --steps 12 \
        --warmup 4 --replica-sync powersgd ;;
  batch)  # issue 22 item 2: steps of BATCH sequences (default 256: 64 microbatches of 4, 262k tokens) with 8 in
          # flight a head, so that the fill, drain and commit take a smaller share of each step
    list=1x1,1x2,2x1; [ "$n" -ge 4 ] && list=1x1,1x2,2x1,4x1,2x2; b=${BATCH:-256}
    layouts scale-large-b$b "$list" --preset large --devices "$all" --codec subspace --dtype auto --steps 8 \
        --warmup 3 --replica-sync powersgd --batch-size "$b" --microbatches-in-flight 8 ;;
  small80)  # small, 3 stages at 80 Mbit/s per host: 1 vs 2 replicas per stage with powersgd, same 2 GPUs;
            # BATCH=64 or 128 (sequences a step; the preset's is 32) runs 30 steps, 8 of them warm-up
    if [ -n "${BATCH:-}" ]; then size=(--batch-size "$BATCH" --steps 30 --warmup 8) name=-b$BATCH
    else size=(--steps 40 --warmup 10) name=; fi
    layouts scale-small-80mbit$name 3x1,3x2 --preset small --devices cuda:0,cuda:1 --codec subspace --dtype auto \
        "${size[@]}" --bandwidth 80mbit --replica-sync powersgd --no-baseline ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
