#!/bin/bash
# issue 54 item 1, the peer: gradient difference compiled vs eager, then swarm local on one GPU with and without
# --compile (2 stages of `large`, bf16), JSON flat under $OUT
python3 -m pip install -q --no-index --no-deps --target "$PWD/.site" .whl_peer/*.whl 2>&1 | tail -2
export PYTHONPATH="$PWD:$PWD/.site:$PYTHONPATH" PATH="$PWD/.site/bin:$PATH"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/log.txt
python3 -c "import torch, hivemind; print('torch', torch.__version__, 'hivemind', hivemind.__version__)" 2>&1 | tee -a $OUT/log.txt
echo "== grads $(date +%T)" | tee -a $OUT/log.txt
timeout 150 python3 docs/results/peer_compile.py $OUT/grads.json large 2>&1 | grep -v Warning | tail -3 | tee -a $OUT/log.txt
for mode in plain compiled; do
  echo "== swarm local $mode $(date +%T)" | tee -a $OUT/log.txt
  flag=""; [ $mode = compiled ] && flag="--compile"
  timeout 200 python3 -c "from swarm.cli import main; main()" local --device cuda --preset large --stages 2 \
    --steps 40 --quiet --no-dashboard --workdir /tmp/w-$mode --metrics-out $OUT/local-$mode.json $flag 2>&1 \
    | tail -4 | tee -a $OUT/log.txt
  tail -3 /tmp/w-$mode/*.log 2>/dev/null | tail -12 >> $OUT/log.txt
done
