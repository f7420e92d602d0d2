#!/usr/bin/env bash
# Which machine kind this is, its roofline table, and the reference model's step with a bf16 KV cache against
# fp32 on it.
#
# #37 item 3 makes `reference:kv=bf16` the default only where it is faster on both kinds of CI machine, with and
# without AMX (docs/benchmarks.md, "Keys and values in bf16"); a session's machine has been the one without.
# .ci/run calls this after the tests, alone on the machine, so that the CI log records the other kind when CI
# lands on it. A measurement for the record: it prints, asserts nothing, and never fails CI.
#   infra/machine-probe.sh [ROUNDS]      (default 3; about two minutes here)
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
echo "== machine probe $(date -u +%Y-%m-%dT%H:%M:%SZ)"
grep -m1 "model name" /proc/cpuinfo
flags=$(grep -m1 "^flags" /proc/cpuinfo)
for f in avx512f avx512_bf16 amx_bf16 amx_tile; do
    case " $flags " in *" $f "*) echo "cpu flag $f: yes" ;; *) echo "cpu flag $f: no" ;; esac
done
echo "cores $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg)"
# #37 item 1 asks for the roofline table on both machine kinds: the default grid, as docs/benchmarks.md shows it
timeout 300 "$PY" -m lab roofline || echo "machine probe: the roofline did not finish"
timeout 300 "$PY" -m lab.results.roofline_37.kv_precision 0 "${1:-3}" || echo "machine probe: the step timing did not finish"
exit 0
