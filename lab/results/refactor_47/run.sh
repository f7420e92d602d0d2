#!/bin/bash
# before/after decoder bench for #47: the same `ssdgen bench` on the tree before the change (5761652, extracted at
# /work/before and run through the checkout's install with its modules mapped there: /work/runs/launch.py) and
# on this tree, alternately, twice; quiet machine.
# usage (from the repo root): lab/results/refactor_47/run.sh [OUT] (default OUT: docs/results/refactor_47)
D="ar,sjd:coupled=true:window=8,ssd+csd:calibrated=false:rows=1"
out=$(realpath -m "${1:-docs/results/refactor_47}")
mkdir -p "$out"
args=(bench --decoders "$D" --n 16 --batch-sizes 1,16 --quality-n 0 --fidelity-n 0)
for round in 1 2; do
for tree in before after; do
  if [ $tree = before ]; then
    (cd /work/before && /work/main/.venv/bin/python /work/runs/launch.py /work/before "${args[@]}" \
       --json "$out/${tree}_round$round.json" > "$out/${tree}_round$round.log" 2>&1)
  else
    .venv/bin/python -m ssdgen.cli "${args[@]}" --json "$out/${tree}_round$round.json" \
       > "$out/${tree}_round$round.log" 2>&1
  fi
  echo "$tree $round rc $? $(date +%T)"
done
done
