#!/usr/bin/env bash
# `ssdgen bench` on one NVIDIA GPU, in under 8 minutes: every decoder at batch sizes 1, 4, 16, 64, with $ per
# 1k images at the GPU's price row, a JSON, a standalone HTML report, and the projection's check on this GPU.
#
#   infra/device-bench.sh OUTDIR [DEVICE_TYPE]
#
# Run from a checkout (any folder: the script cds to the repo root). Needs a Python with a CUDA build of torch
# already installed (the script never installs torch; set PYTHON=... to pick one, default python3). The bench
# needs only numpy, safetensors, scipy, tqdm, pillow, matplotlib, typer, fsspec and pyarrow besides torch (no
# Prefect, no Ray): the ones missing are pip-installed, and the repo is put on PYTHONPATH rather than
# `pip install -e .` (pyproject pins Python 3.11; GPU images often ship another Python).
# DEVICE_TYPE is the output/prices.csv row (h100, h200, a100-40gb, l4, a10g); default: from nvidia-smi's name.
#
# Sizing: a probe decodes one prompt with each decoder on the GPU (a smoke test: a decoder that fails on CUDA
# is left out, with its error in OUTDIR/probe.log) and times it; n and quality_n are then picked so the
# bench fits ~5 minutes; if it still overruns, a minimal bench (n 8, batches 1 and 64, no quality) runs.
#
# Overrides (for a dry run of the script on a CPU, or another size): BENCH_DEVICE (cuda), BENCH_N, BENCH_QN,
# BENCH_BATCHES (1,4,16,64), BENCH_MODEL (a --model spec, e.g. reference:/path/to/tiny), e.g. BENCH_DEVICE=cpu BENCH_N=1 BENCH_QN=0 BENCH_BATCHES=1,2 infra/device-bench.sh /tmp/o cpu
#
# Shape replay: the forward shapes each decoder produced on the trained reference model (the bench's traces)
# are replayed on random-weight Janus-Pro-1B- and 7B-shaped models in bf16 (lab/bench/shape_replay.py): measured
# images/s per decoder and batch at the trace's 16x16 grid, and the roofline projection's error against them.
# `--tiny` runs everything on the CPU with tiny shapes (the test suite does), producing the same files.
#
# Writes: OUTDIR/bench.json, OUTDIR/bench.html, OUTDIR/replay.json, OUTDIR/replay.log, OUTDIR/calibration.json
# (projection vs measured on this GPU), OUTDIR/env.txt, OUTDIR/probe.json, OUTDIR/probe.log, OUTDIR/bench.log.
set -euo pipefail

TINY=0
if [ "${1:-}" = "--tiny" ]; then  # a CPU check of the whole script: tiny shapes, one prompt, no quality
    TINY=1; shift
    export BENCH_DEVICE=cpu BENCH_N=${BENCH_N:-1} BENCH_QN=0 BENCH_BATCHES=${BENCH_BATCHES:-1,2}
fi
OUT=${1:?usage: infra/device-bench.sh [--tiny] OUTDIR [DEVICE_TYPE]}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEV=${BENCH_DEVICE:-cuda}
BATCHES=${BENCH_BATCHES:-1,4,16,64}
T0=$(date +%s)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

say() { echo "[device-bench +$(( $(date +%s) - T0 ))s] $*"; }

# 1. torch with CUDA --------------------------------------------------------------------------------------
if [ "$DEV" != cpu ] && ! "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    echo "error: $PY has no torch with a usable CUDA device (install a CUDA build of torch first; this script never does)" >&2
    exit 2
fi

# 2. the bench's other dependencies -----------------------------------------------------------------------
missing=$("$PY" - <<'EOF'
import importlib.util
need = {"numpy": "numpy", "safetensors": "safetensors", "scipy": "scipy", "tqdm": "tqdm", "PIL": "pillow",
        "matplotlib": "matplotlib", "typer": "typer", "fsspec": "fsspec", "pyarrow": "pyarrow"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
EOF
)
if [ -n "$missing" ]; then
    say "installing missing packages: $missing"
    read -r -a pkgs <<< "$missing"
    if ! "$PY" -m pip install -q "${pkgs[@]}"; then
        echo "error: could not pip-install: $missing (no package index reachable?); carry them as wheels" >&2
        exit 2
    fi
fi

# 3. device type from the GPU's name ------------------------------------------------------------------------
GPU=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
DT=${2:-}
[ "$TINY" = 1 ] && DT=${DT:-cpu}
if [ -z "$DT" ]; then
    case "$GPU" in
        *H200*) DT=h200 ;;
        *H100*) DT=h100 ;;
        *A100*) DT=a100-40gb ;;
        *A10G*) DT=a10g ;;
        *L4*) DT=l4 ;;
        *) echo "error: no price row for GPU '$GPU'; pass DEVICE_TYPE (one of output/prices.csv's device_type)" >&2
           exit 2 ;;
    esac
fi
{
    echo "gpu: $GPU"; echo "device_type: $DT"; echo "python: $("$PY" -V 2>&1)"
    "$PY" -c 'import torch; print("torch:", torch.__version__, "cuda:", torch.version.cuda,
                                  torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU")'
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
} > "$OUT/env.txt"
cat "$OUT/env.txt"

# 4. probe: every decoder once on CUDA (smoke test + timing), then size the bench ----------------------------
say "probe"
"$PY" - "$OUT" "$DEV" <<'EOF' 2> >(tee "$OUT/probe.log" >&2)
import json, os, sys, time, traceback
import torch
import dataclasses
from ssdgen.decoders import DecodeSpec, run
from ssdgen.decoders.sampling import SamplingConfig
from ssdgen.reference.prompts import eval_prompts
from ssdgen.models.registry import load_model
out, dev = sys.argv[1], sys.argv[2]
sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
m = load_model(os.environ.get("BENCH_MODEL") or None, device=dev)
sc = SamplingConfig(cfg_scale=3.0)
prompts = [r["prompt"] for r in eval_prompts(2)]
ok, secs = [], {}
# the lossless decoder with proactive drafting (#25): its extra tree entries cost little where a forward is
# latency-bound, which a GPU is at these batch sizes and two CPU cores are not
for d in ("ar", "sjd", "csd", "ssd", "ssd+csd", "ssd:lossless=true:rows=4:branches=8:branch_len=16"):
    probe = d + ":calibrated=false" if d == "ssd+csd" else d  # the probe times the engine, not a calibration
    spec = dataclasses.replace(DecodeSpec.parse(probe), sampling=sc)
    try:
        run(spec, m, prompts, [0, 1])  # warm-up and smoke test at batch 2
        sync()
        t0 = time.perf_counter()
        run(spec, m, prompts[:1], [0])
        sync()
        secs[d] = time.perf_counter() - t0
        ok.append(d)
    except Exception as e:  # a decoder that fails on CUDA is reported and left out, the others still run
        print(f"probe: {d} failed on {dev}: {type(e).__name__}: {e}", file=sys.stderr)
        traceback.print_exc()
if "ar" not in ok:
    sys.exit(f"probe: ar failed on {dev}; nothing to compare against")
total = sum(secs.values())  # s for one image through every decoder at batch 1
n = int(max(8, min(64, 270 / (1.4 * total))) // 8 * 8)
quality_n = 256 if total < 3 else 64
json.dump({"decoders": ok, "s_per_image_batch1": secs, "n": n, "quality_n": quality_n}, open(f"{out}/probe.json", "w"),
          indent=1)
print(json.dumps({"decoders": ok, "s_per_image_batch1": secs, "n": n, "quality_n": quality_n}))
EOF
read -r DECODERS N QN < <("$PY" -c "import json; p=json.load(open('$OUT/probe.json')); print(','.join(p['decoders']), p['n'], p['quality_n'])")
N=${BENCH_N:-$N}
QN=${BENCH_QN:-$QN}
say "bench: decoders $DECODERS, n $N, quality_n $QN, device type $DT"

# 5. the bench ---------------------------------------------------------------------------------------------
bench() {
    timeout "$1" "$PY" -m ssdgen.cli bench --device "$DEV" --device-type "$DT" --decoders "$DECODERS" --n "$2" \
        ${BENCH_MODEL:+--model "$BENCH_MODEL"} \
        --batch-sizes "$3" --quality-n "$4" --fidelity-n "${BENCH_FIDELITY_N:-0}" --json "$OUT/bench.json" --html "$OUT/bench.html" 2>&1 | tee -a "$OUT/bench.log"
    return "${PIPESTATUS[0]}"
}
if ! bench 330 "$N" "$BATCHES" "$QN" && [ "$TINY" = 0 ]; then
    say "full bench failed or overran 330 s; running the minimal one (n 8, batches 1 and 64, no quality)"
    bench 90 8 1,64 0
fi

# 6. shape replay: the forward shapes each decoder produced above, timed on Janus-Pro-1B/7B-shaped models --
say "shape replay"
if [ "$TINY" = 1 ]; then REPLAY=(--tiny --device cpu); else REPLAY=(--device "$DEV" --accelerator "$DT"); fi
timeout 200 "$PY" -m lab shape-replay "$OUT/bench.json" "$OUT/replay.json" --budget-s 150 "${REPLAY[@]}" \
    2>&1 | tee "$OUT/replay.log" || say "shape replay failed or overran (see replay.log)"

# 7. the projection's method checked on this GPU (its bandwidth and FLOP/s measured here) -------------------
say "projection check"
"$PY" -m lab projection-check "$OUT/bench.json" --out "$OUT/calibration.json" --device "$DEV" 2>&1 | tee "$OUT/calibration.log" || true
say "done: $(find "$OUT" -maxdepth 1 -type f -printf '%f ')"
