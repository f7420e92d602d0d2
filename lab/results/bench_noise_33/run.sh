#!/usr/bin/env bash
# #33's bench checks (2026-12-03, 2 CPU cores): AR against AR on a quiet machine and beside a CPU-bound process,
# and ar,ssd+csd where the plan decodes a batch size as plain AR. Run from the repository root, machine quiet
# (lab/results/bench_noise_33/run.sh); the outputs go to docs/results/bench_noise_33.
set -euo pipefail
D=docs/results/bench_noise_33
B=".venv/bin/ssdgen bench --quality-n 0 --fidelity-n 0"
$B --decoders "ar,ar" --n 8 --batch-sizes 1,8 --json $D/ar_ar_quiet.json --html $D/ar_ar_quiet.html \
    2>/dev/null | tee $D/ar_ar_quiet.txt
python3 -c "while True: pass" & BUSY=$!
trap 'kill $BUSY 2>/dev/null || true' EXIT
$B --decoders "ar,ar" --n 8 --batch-sizes 1,8 --json $D/ar_ar_loaded.json 2>/dev/null | tee $D/ar_ar_loaded.txt
kill $BUSY
# run on 2026-12-03 with --n 4, beside the test suite (a loaded machine: it warns, and its floor is wide)
$B --decoders "ar,ssd+csd" --n 4 --batch-sizes 1,16 --json $D/ar_ssdcsd.json --html $D/ar_ssdcsd.html \
    2>/dev/null | tee $D/ar_ssdcsd.txt
