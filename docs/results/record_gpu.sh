#!/usr/bin/env bash
# The GPU runs of `swarm bench record` behind docs/benchmarks.md "The public record's setting", as run
# on the device machine (torch preinstalled; hivemind and the rest carried as wheels in .whl, see
# ../shared/gpu/README.md). One part per call (each fits the 10-minute limit of a call): the curves
# that docs/img/record-gpu-h100-convergence.json lacks are trained (--resume keeps the others), then
# the swarms, then record.json; commit OUT/rec/convergence.json over that file between the calls.
# Usage: bash docs/results/record_gpu.sh curves|throughput OUT_DIR
set -uo pipefail
part=$1 out=$2
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl/*.whl 2>/dev/null
export PYTHONPATH="$PWD/.site:$PWD"
nvidia-smi -L
mkdir -p "$out/rec"
[ -f "$out/rec/convergence.json" ] || cp docs/img/record-gpu-h100-convergence.json "$out/rec/convergence.json"
python3 -m swarm.cli bench record --device cuda --tokens 6500000 --steps 8 --resume --parts "$part" \
    --out "$out/rec" 2>&1 | grep -v "^WARNING" | grep -E "step +(190|396):|tok/s|final val|reusing|record|sooner|Error|error"
echo "== exit ${PIPESTATUS[0]}"
