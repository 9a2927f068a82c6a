#!/usr/bin/env bash
# The test command of the README: unit tests (tiny random LLaMA) and end-to-end tests (real SmolLM2 weights).
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
