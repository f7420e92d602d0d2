#!/bin/bash
# before/after decoder bench for #23: the same command on the session's start (c5eb580) and on HEAD, one after the other
D="ar,sjd:coupled=true:window=8,ssd:lossless=true:rows=1,ssd+csd:calibrated=false:rows=1"
for round in 1 2; do
for tree in before after; do
  dir=/tmp/before; [ $tree = after ] && dir=/work/main
  cd $dir && /work/main/.venv/bin/python -m ssdgen.cli bench --decoders "$D" --n 32 --batch-sizes 1,64 \
     --quality-n 0 --fidelity-n 0 --json /tmp/perf/$tree-$round.json > /tmp/perf/$tree-$round.log 2>&1
  echo "$tree $round rc $?"
done
done
