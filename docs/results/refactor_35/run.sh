#!/bin/bash
# before/after decoder bench for #35: the same command on the tree before the change (6843b0d, /work/main with its
# own editable install) and after it (/work/wt), alternately, twice; quiet machine
D="ar,sjd:coupled=true:window=8,ssd:lossless=true:rows=1,ssd+csd:calibrated=false:rows=1"
out=${1:-docs/results/refactor_35}
mkdir -p "$out"
for round in 1 2; do
for tree in before after; do
  dir=/work/main; [ $tree = after ] && dir=/work/wt
  (cd $dir && .venv/bin/python -m ssdgen.cli bench --decoders "$D" --n 8 --batch-sizes 1,16 --rounds 2 \
     --quality-n 0 --fidelity-n 0 --json "$OLDPWD/$out/${tree}_round$round.json" > "/tmp/bench35_${tree}_$round.log" 2>&1)
  echo "$tree $round rc $?"
done
done
