#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in about 10 minutes: the mapping tests and the backend conformance suite on
# CUDA, then a study of 5 configurations with `autotune search --backend cuda` (eager bf16, int4 eager, O1, compiled
# w8a8, O2 with CUDA graphs) on a tiny random LLaMA, and one table: throughput, TTFT, TPOT, peak memory, the gain
# over the baseline, compile time and CUDA graph skips per configuration.
#
# Needs no network. The machine brings its CUDA build of torch and transformers 5; what else the check imports
# (optuna and its dependencies, torchao, jsonschema, pytest) travels with the working tree as wheels in
# scripts/device_check/wheels/ and is unpacked into $OUT/site where the machine lacks it. Python: $PYTHON, else
# .venv/bin/python where a .venv exists, else the machine's python3. Each step has its own time limit; a step
# that fails is reported at the end and the rest still run, so one run gives every figure it can.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x .venv/bin/python ]; then PY=.venv/bin/python
else PY=$(command -v python3 || command -v python)
fi
OUT=${OUT:-$(mktemp -d)}
export AUTOTUNE_CACHE=${AUTOTUNE_CACHE:-$OUT/cache}  # reference, gate and inductor caches of this run only
STUDY=device-check-$(date -u +%Y%m%dT%H%M%S)
DB="sqlite:///$OUT/$STUDY.db"
status=0

echo "== $(date -u '+%Y-%m-%d %H:%M UTC')  $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi absent')"
echo "== python $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])')); packages (carried wheels unpacked into $OUT/site where missing)"
"$PY" scripts/device_check/install_wheels.py "$OUT/site"
export PYTHONPATH="$OUT/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

echo "== model: a tiny random LLaMA, generated (no download)"
"$PY" scripts/device_check/tiny_llama.py "$OUT/tiny-llama"

echo "== tests: device mappings, graphs, memory watch; conformance on CUDA (a skip counts as a failure here)"
timeout 150 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_device_mapping.py tests/test_device_graphs.py \
    tests/test_memory_watch.py tests/test_backend_conformance.py -k "not conformance or cuda" 2>&1 \
    | tee "$OUT/tests.txt" | tail -n 15 || status=1
if grep -q "SKIPPED.*'cuda' is absent" "$OUT/tests.txt"; then echo "device_check: CUDA was skipped" >&2; exit 1; fi

echo "== study: 5 configurations of search_spaces/device_check.yaml (scripts/device_check/plan.py)"
# --trial-memory-mb: the limit is watched (resident memory), not RLIMIT_AS, on CUDA; a trial that starts at all
# shows that the limit no longer stops CUDA's start-up. Generous: inductor's compile workers count in it.
trials=$("$PY" scripts/device_check/plan.py "$STUDY" "$DB" search_spaces/device_check.yaml)
timeout 400 "$PY" -m autotune.cli search --backend cuda --model "$OUT/tiny-llama" --trials "$trials" \
    --study "$STUDY" --storage "$DB" --space search_spaces/device_check.yaml --requests 16 --prompt-tokens 112:144 \
    --output-tokens 64 --repeats 2 --trial-timeout 240 --timeout 6 --trial-memory-mb 32000 --no-guide \
    --no-warm-start --out "$OUT/recipes" --seed 0 2>&1 | tail -n 30 \
    || { echo "device_check: the study stopped early (time limit or error); the table shows what finished"; status=1; }

echo "== per configuration"
"$PY" scripts/device_check/table.py "$STUDY" "$DB" || status=1
echo "== $((SECONDS / 60)) min $((SECONDS % 60)) s; files in $OUT"
exit $status
