#!/usr/bin/env bash
# Smoke test of the built wheel, as a user gets it (`pip install .`, not editable): every file ssdgen reads at
# run time must be package data, never a path in a checkout.
#
#   infra/wheel-smoke.sh            (`make wheel-smoke`; .ci/run runs it after `make test`)
#
# 1. copies the working tree's files (tracked, and untracked ones git does not ignore: uncommitted work is
#    tested too) into a temporary folder and builds the wheel there with setuptools, no dependencies.
#    Its file list must hold the product only (issue #47): ssdgen and its dist-info, no lab/, docs/ or results
#    code, none of the lab's modules (the reference model's and the scorer's training, the research benchmarks);
# 2. makes a fresh venv (pip's cache, no byte-compiling: about a minute), installs torch==2.13.0
#    first (the local CPU wheel: nothing after it may pull a CUDA build), then the wheel;
# 3. from an empty folder, PYTHONPATH unset and no analytics variables set, runs `ssdgen generate` (4 bundled
#    example prompts, --decoder ar), `status`, `report` and a tiny `bench` with its HTML page: each must exit
#    0, and none may print "telemetry" (issue #33).
#
# Env: PY (the Python that builds the wheel and makes the venv; default .venv/bin/python, which has setuptools),
# KEEP=1 keeps the temporary folder. Exit: 0 when every step passed, else the failing step's status.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PY:-$ROOT/.venv/bin/python}
T0=$(date +%s)
say() { echo "[wheel-smoke +$(( $(date +%s) - T0 ))s] $*"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ssdgen-wheel-smoke.XXXXXX")
cleanup() { if [ "${KEEP:-0}" = 1 ]; then echo "kept $WORK"; else rm -rf "$WORK"; fi; }
trap cleanup EXIT

# 1. the wheel, from a clean copy of the working tree (a file deleted but not yet staged is skipped)
mkdir -p "$WORK/src" "$WORK/dist" "$WORK/run"
git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -f "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp --parents -t "$WORK/src"
# --no-build-isolation: the build needs only setuptools, which $PY has (no index needed)
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/ssdgen-*.whl)
say "built $(basename "$WHEEL")"

# 1b. the product only (issue #47): no lab, no docs, no training code for the reference model or its scorer
"$PY" - "$WHEEL" <<'EOF'
import re, sys, zipfile
wheel = sys.argv[1]
names = zipfile.ZipFile(wheel).namelist()
tops = {n.split("/")[0] for n in names}
bad = sorted(t for t in tops if t != "ssdgen" and not re.fullmatch(r"ssdgen-[^/]+\.dist-info", t))
lab = {"train", "train_gpt", "train_data", "train_scorer", "validate_scorer", "tokenizer_report", "commit_maps",
       "figures", "roofline", "host_time", "shape_replay", "projection_check", "shard_overhead", "scaling",
       "scale", "sharding", "pipeline", "formats", "screenshot"}  # the lab's modules (lab/reference, lab/bench)
bad += [n for n in names if re.fullmatch(r"ssdgen/(reference|bench)/(\w+)\.py", n)
        and re.fullmatch(r"ssdgen/(reference|bench)/(\w+)\.py", n).group(2) in lab]
bad += [n for n in names if "results/" in n or n.startswith(("docs/", "lab/")) or n.endswith((".sh", "_attempt.c"))]
z = zipfile.ZipFile(wheel)
scorer = z.read("ssdgen/reference/scorer.py").decode()
bad += ["ssdgen/reference/scorer.py: training code"] * any(w in scorer for w in ("def train_scorer", ".backward("))
if bad:
    sys.exit(f"error: the wheel holds what is not the product's: {bad}")
py = [n for n in names if n.endswith(".py")]
lines = sum(z.read(n).count(b"\n") for n in py)
print(f"wheel: {len(names)} files, {len(py)} modules ({lines} lines), no lab, docs or training code")
EOF
say "$(du -k "$WHEEL" | cut -f1) KiB"

# 2. a fresh venv with the wheel; torch first and pinned, as the Makefile does. pip's cache as usual (never
# --no-cache-dir); --no-compile: byte-compiling every module of torch, ray and prefect took 3 of the 4 minutes
# here, and the commands compile the few they import
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
pip_install() {  # pip's output only when it fails (the machine's index settings make it chatty)
    "$V/pip" install -q --no-compile "$@" > "$WORK/pip.log" 2>&1 || { cat "$WORK/pip.log" >&2; return 1; }
}
pip_install torch==2.13.0
pip_install "$WHEEL"
say "installed into a fresh venv"

# 3. the commands, from an empty folder that sees nothing of the checkout
cd "$WORK/run"
unset PYTHONPATH PREFECT_SERVER_ANALYTICS_ENABLED DO_NOT_TRACK RAY_USAGE_STATS_ENABLED RAY_ADDRESS
export PREFECT_HOME="$WORK/prefect-home" SSDGEN_CACHE="$WORK/cache" SSDGEN_OBJECT_STORE_BYTES=$((100 * 2**20))
"$V/python" - "$ROOT" <<'EOF'
import sys
from pathlib import Path
import pyarrow.parquet as pq
import ssdgen
from ssdgen.output.cost import DEFAULT_PRICES, load_prices
from ssdgen.reference.prompts import EXAMPLES_PARQUET
root, where = Path(sys.argv[1]).resolve(), Path(ssdgen.__file__).resolve()
if root in where.parents:
    sys.exit(f"error: ssdgen imported from the checkout ({where}), not from the wheel")
assert "cpu" in load_prices(), DEFAULT_PRICES
import shutil
from ssdgen.reference import decode_attention
if shutil.which("cc") and decode_attention.library() is None:  # the C source ships in the wheel and builds
    sys.exit("error: the decode-attention op did not build from the wheel")
pq.write_table(pq.read_table(EXAMPLES_PARQUET).slice(0, 4), "prompts.parquet")
print(f"ssdgen from {where.parent}; prices {DEFAULT_PRICES.name}; 4 example prompts")
EOF
run() {  # one command; its output to the console and to a log that is searched for telemetry afterwards
    say "ssdgen $*"
    "$V/ssdgen" "$@" 2>&1 | tee -a "$WORK/commands.log"
}
run generate --prompts prompts.parquet --out out/run --decoder ar --actors 1 --batch-size 4 --no-progress
run status out/run
run report out/run --html report.html --samples 4
run bench --n 2 --decoders ar --batch-sizes 1 --rounds 1 --quality-n 0 --fidelity-n 0 --json bench.json \
    --html bench.html
for f in out/run/manifest.parquet out/run/summary.json report.html bench.json bench.html; do
    [ -s "$f" ] || { echo "error: $f was not written" >&2; exit 1; }
done
if grep -qi telemetry "$WORK/commands.log"; then
    echo "error: a command printed telemetry text:" >&2; grep -i telemetry "$WORK/commands.log" >&2; exit 1
fi
say "ok: generate, status, report and bench ran from the installed wheel"
