#!/usr/bin/env bash
# On a machine with a CUDA GPU: the backend conformance suite on CUDA, then a small study (SmolLM2, 8 trials)
# with `autotune search --backend cuda`, and a table per configuration: throughput, TTFT, TPOT, peak memory, and
# the best over the speed baseline. Installs nothing (HF_HUB_OFFLINE, no pip): the venv must already hold a CUDA
# build of torch 2.13.0 and the SmolLM2 weights. Sized for < 8 minutes: each step has its own time limit.
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_NO_INDEX=1
PY=${PYTHON:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
STUDY=device-check-$(date -u +%Y%m%dT%H%M%S)
DB="sqlite:///$OUT/$STUDY.db"

echo "== $(date -u '+%Y-%m-%d %H:%M UTC')  $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi absent')"
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"

echo "== conformance suite on the CUDA backend (skips count as failures here: the GPU must be usable)"
# A failure here is reported at the end; the study still runs, so that one run gives every figure it can.
status=0
timeout 180 "$PY" -m pytest -q -p no:cacheprovider -rs tests/test_backend_conformance.py tests/test_device_mapping.py \
    -k cuda 2>&1 | tee "$OUT/conformance.txt" || status=1
if grep -q "SKIPPED.*'cuda' is absent" "$OUT/conformance.txt"; then echo "device_check: CUDA was skipped" >&2; exit 1; fi

echo "== study: SmolLM2, 8 trials, search_spaces/device_check.yaml"
timeout 330 "$PY" -m autotune.cli search --backend cuda --model smollm2-135m --trials 8 --study "$STUDY" \
    --storage "$DB" --space search_spaces/device_check.yaml --requests 16 --prompt-tokens 112:144 \
    --output-tokens 64 --repeats 2 --trial-timeout 120 --out "$OUT/recipes" --seed 0 2>&1 | tail -n 30 \
    || { echo "device_check: the study stopped early (time limit or error); the table shows what finished"; status=1; }

echo "== per configuration"
"$PY" - "$STUDY" "$DB" <<'PYEOF'
import sys

import optuna

from autotune.config.deploy import DeployConfig

optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=sys.argv[1], storage=sys.argv[2])
base = study.user_attrs.get("speed_baseline", {}).get("bench", {})
base_tput = base.get("throughput_tok_s")
print(f"{'#':>3}  {'configuration':<44} {'status':<8} {'tok/s':>8} {'TTFT p50':>9} {'TPOT p50':>9} "
      f"{'peak MB':>8} {'vs base':>8}")
best = None
for t in study.trials:
    attrs = t.user_attrs
    config = DeployConfig(**attrs["config"]).label() if "config" in attrs else str(t.params)
    b = attrs.get("bench")
    if not b:
        print(f"{t.number:>3}  {config:<44} {attrs.get('status', t.state.name):<8} {attrs.get('reason', '')[:60]}")
        continue
    ratio = b["throughput_tok_s"] / base_tput if base_tput else float("nan")
    print(f"{t.number:>3}  {config:<44} {'ok':<8} {b['throughput_tok_s']:>8.1f} {b['ttft_p50_ms']:>8.1f}ms "
          f"{b['tpot_p50_ms']:>8.2f}ms {b['peak_memory_mb']:>8.0f} {ratio:>7.2f}x")
    if best is None or b["throughput_tok_s"] > best[1]["throughput_tok_s"]:
        best = (config, b)
if base:
    print(f"baseline (transformers generate, bf16, eager): {base_tput:.1f} tok/s, TTFT p50 {base['ttft_p50_ms']:.1f} ms, "
          f"TPOT p50 {base['tpot_p50_ms']:.2f} ms, peak {base['peak_memory_mb']:.0f} MB")
if best and base_tput:
    print(f"best: {best[0]}: {best[1]['throughput_tok_s']:.1f} tok/s = {best[1]['throughput_tok_s'] / base_tput:.2f}x "
          "the baseline")
PYEOF
exit $status
