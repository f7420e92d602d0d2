#!/usr/bin/env bash
# #25's frontier in one bench run: wall clock at batch 1, 4, 16, 64 and fidelity (NLL gap to ar on 64 prompts at
# batch 16) for the lossless default, the lossless decoder with the fewest forwards, the ssd+csd default and
# ssd+csd with the fewest forwards. Usage: lab/results/frontier_25/run.sh [OUTDIR]
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=${1:-docs/results/frontier_25}
.venv/bin/ssdgen bench --decoders "ar,ssd:lossless=true,ssd:lossless=true:rows=4:branches=8:branch_len=16,\
ssd+csd,ssd+csd:calibrated=false:rows=4:branches=4:branch_len=32:continuation=true" \
  --n 64 --batch-sizes 1,4,16,64 --quality-n 0 --fidelity-n 64 --quality-batch 16 \
  --json "$OUT/bench.json" --html "$OUT/bench.html"
