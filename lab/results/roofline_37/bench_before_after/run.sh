#!/bin/bash
# #37's before/after bench, on a quiet machine: e8a275e (before #37's step changes) against the checkout, and the
# checkout with `--model reference:kv=bf16`, one round each, 3 repetitions in rotating order; then summarize.py.
# Both write and read in the folder they are run from, the outputs' folder under docs/results/roofline_37:
# bench_before_after for the first run, bench_head for the rerun at 8b1a0c3 and bench_loop for #37's C loop, e.g.
#   cd docs/results/roofline_37/bench_head && L=../../../../lab/results/roofline_37 &&
#   $L/bench_before_after/run.sh && python3 $L/bench_before_after/summarize.py
# The `before` code is installed apart and put first on the path:
#   git worktree add /tmp/before e8a275e && .venv/bin/pip install --no-deps --target /tmp/before_site /tmp/before
# The planner's choices (cal_*.txt): `ssdgen calibrate --batch-sizes 1,16,64,128` under the same three, interleaved.
SSDGEN=${SSDGEN:-../../../../.venv/bin/ssdgen}
BEFORE_SITE=${BEFORE_SITE:-/tmp/before_site}
ARGS="--decoders ar,sjd --batch-sizes 64,128 --n 128 --rounds 1 --quality-n 0 --fidelity-n 0"
one() {  # version rep
  case $1 in
    before) PYTHONPATH=$BEFORE_SITE $SSDGEN bench $ARGS --json "$1_$2.json" > "$1_$2.log" 2>&1 ;;
    after) $SSDGEN bench $ARGS --json "$1_$2.json" > "$1_$2.log" 2>&1 ;;
    kv) $SSDGEN bench $ARGS --model reference:kv=bf16 --json "$1_$2.json" > "$1_$2.log" 2>&1 ;;
  esac
  echo "$(date +%T) $1 $2 rc=$? load $(cut -d' ' -f1-3 /proc/loadavg)" >> progress.log
}
for rep in 1 2 3; do
  case $rep in 1) order="before after kv";; 2) order="after kv before";; 3) order="kv before after";; esac
  for v in $order; do one $v "$rep"; done
done
