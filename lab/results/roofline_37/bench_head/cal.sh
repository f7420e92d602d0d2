#!/bin/bash
# The planner's choices at the head: `ssdgen calibrate --batch-sizes 1,16,64,128` under before (e8a275e, installed
# apart as ../bench_before_after/run.sh says), the head, and the head with --model reference:kv=bf16; 2 rounds,
# interleaved. Run from the outputs' folder (docs/results/roofline_37/bench_head, or bench_loop), as run.sh is.
SSDGEN=${SSDGEN:-../../../../.venv/bin/ssdgen}
BEFORE_SITE=${BEFORE_SITE:-/tmp/before_site}
ARGS="--batch-sizes 1,16,64,128"
for rep in 1 2; do
  PYTHONPATH=$BEFORE_SITE $SSDGEN calibrate $ARGS --json "cal_before_$rep.json" > "cal_before_$rep.txt" 2>&1
  $SSDGEN calibrate $ARGS --json "cal_after_$rep.json" > "cal_after_$rep.txt" 2>&1
  $SSDGEN calibrate $ARGS --model reference:kv=bf16 --json "cal_kv_$rep.json" > "cal_kv_$rep.txt" 2>&1
done
