#!/bin/bash
# before/after decoder bench for #35: the same command on the tree before the change (6843b0d, checked out at
# /work/before with its own editable install) and after it (/work/main), alternately, twice; quiet machine.
# usage (from /work/main): lab/results/refactor_35/run.sh [OUT] (default OUT: docs/results/refactor_35)
D="ar,sjd:coupled=true:window=8,ssd:lossless=true:rows=1,ssd+csd:calibrated=false:rows=1"
out=$(realpath -m "${1:-docs/results/refactor_35}")
mkdir -p "$out"
for round in 1 2; do
for tree in before after; do
  dir=/work/main; [ $tree = before ] && dir=/work/before
  (cd $dir && .venv/bin/python -m ssdgen.cli bench --decoders "$D" --n 32 --batch-sizes 1,64 \
     --quality-n 0 --fidelity-n 0 --json "$out/${tree}_round$round.json" > "$out/${tree}_round$round.log" 2>&1)
  echo "$tree $round rc $? $(date +%T)"
done
done
