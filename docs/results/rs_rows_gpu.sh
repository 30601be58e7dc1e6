#!/usr/bin/env bash
# rs_rows.py's rows side by side on one GPU machine (torch preinstalled; hivemind and the rest carried as
# wheels in .whl, see ../shared/gpu/README.md), each row a process; rows already in KEPT (committed from an
# earlier call) are kept, so a second call runs only the rest. The call's limit cuts a row short, not the others.
# The rows run in a scratch folder seeded with KEPT's rows; only DIR/summary.json (every row, curves included)
# comes back, since a device call returns a few files only.
# Usage: bash docs/results/rs_rows_gpu.sh KEPT DIR STEPS LIMIT_S MODE:OFFSET...   (e.g. exact:0 p8:0 p32:1)
set -uo pipefail
kept=$1 dir=$2 steps=$3 limit=$4; shift 4
work=$(mktemp -d)
cp "$kept"/*-seed*.json "$work"/ 2>/dev/null
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl 2>/dev/null
export PYTHONPATH="$PWD/.site:$PWD" OMP_NUM_THREADS=2
nvidia-smi -L
mkdir -p "$dir"
for job in "$@"; do
    timeout "$limit" python3 docs/results/rs_rows.py "$work" "$steps" "${job#*:}" "${job%%:*}" cuda \
        > "$work/${job%%:*}-seed${job#*:}.log" 2>&1 &
done
wait
tail -n 2 "$work"/*.log | grep -v "^WARNING"
python3 docs/results/rs_rows.py summary "$work" "$dir/summary.json"
