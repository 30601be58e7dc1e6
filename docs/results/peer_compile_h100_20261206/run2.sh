#!/bin/bash
# issue 54 item 1, the peer, second run: compiled vs compiled gradients, and a replicated swarm (2 stages x 2
# replicas of `large`, spot checks on) with and without the run's --compile
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl_peer/*.whl 2>&1 | tail -2
export PYTHONPATH="$PWD:$PWD/.site:$PYTHONPATH" PATH="$PWD/.site/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/log3.txt
echo "== grads $(date +%T)" | tee -a $OUT/log3.txt
true
for mode in plain compiled; do
  echo "== swarm local --replicas 2 $mode $(date +%T)" | tee -a $OUT/log3.txt
  flag=""; [ $mode = compiled ] && flag="--compile"
  timeout 200 python3 -c "from swarm.cli import main; main()" local --device cuda --preset small --stages 2 \
    --replicas 2 --steps 40 --quiet --no-dashboard --workdir /tmp/r-$mode --metrics-out $OUT/replicas-$mode.json \
    $flag 2>&1 | tail -3 | tee -a $OUT/log3.txt
  echo "banned lines: $(cat /tmp/r-$mode/*.log | grep -c 'banned for the run')" | tee -a $OUT/log3.txt
  echo "checks passed: $(cat /tmp/r-$mode/*.log | grep -c 'is its work')" | tee -a $OUT/log3.txt
  grep -h "compile_blocks" /tmp/r-$mode/run.json > /dev/null && echo "run spec: compile_blocks" | tee -a $OUT/log3.txt
done
