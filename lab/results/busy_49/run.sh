#!/usr/bin/env bash
# #49 item 1: the bench of the issue, quiet and beside one busy process, with this code and with the code before
# the thread governor (BEFORE, a commit; AFTER, default HEAD). Run from the repo root on a quiet machine:
#   BEFORE=5d1db0c lab/results/busy_49/run.sh docs/results/busy_49
# Order: before quiet, after quiet, after busy, after quiet, before quiet (each kind of run on both sides of
# the busy one). Both run from a `git archive` of their commit through the editable install's finder (launch.py),
# so edits in the working tree meanwhile change nothing.
set -euo pipefail
OUT=${1:?output folder}; BEFORE=${BEFORE:?commit before the change}
AFTER=${AFTER:-HEAD}
mkdir -p "$OUT"; TREE=$(mktemp -d); NEW=$(mktemp -d); BUSY=
trap 'rm -rf "$TREE" "$NEW"; [ -n "$BUSY" ] && kill $BUSY 2>/dev/null || true' EXIT
git archive "$BEFORE" | tar -x -C "$TREE"; git archive "$AFTER" | tar -x -C "$NEW"
echo "before $(git rev-parse --short "$BEFORE"), after $(git rev-parse --short "$AFTER"), $(date -u +%FT%TZ)" > "$OUT/commits.txt"
ARGS=(bench --decoders ar,ar --n 8 --batch-sizes 1,8 --quality-n 0 --fidelity-n 0)
run() {  # name, code root
  local t0=$(date +%s.%N)
  .venv/bin/python lab/results/busy_49/launch.py "$2" "${ARGS[@]}" --json "$OUT/$1.json" > "$OUT/$1.log" 2>&1
  echo "$1 $(echo "$(date +%s.%N) - $t0" | bc) s" | tee -a "$OUT/wall.txt"
}
: > "$OUT/wall.txt"
run before-quiet-1 "$TREE"
run after-quiet-1 "$NEW"
python3 -c "while True: pass" & BUSY=$!
sleep 2
run after-busy "$NEW"
kill $BUSY; BUSY=
sleep 2
run after-quiet-2 "$NEW"
run before-quiet-2 "$TREE"
.venv/bin/python lab/results/busy_49/summarize.py "$OUT" | tee "$OUT/summary.md"
