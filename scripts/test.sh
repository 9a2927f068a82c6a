#!/usr/bin/env bash
# The test command of the README (and of .ci/run): unit tests (tiny random LLaMA), distributed tests against a
# throw-away PostgreSQL on loopback, browser tests in headless Chromium, end-to-end tests on the real SmolLM2.
# `--fast` first: only the tests not marked slow (a few minutes; CI runs everything). Other arguments go to pytest.
set -euo pipefail
fast=()
if [ "${1:-}" = "--fast" ]; then
    shift
    fast=(-m "not slow")
fi
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -z "${AUTOTUNE_TEST_PG_URL:-}" ] && ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1; then
    eval "$(bash scripts/pg.sh start)"
    trap 'bash scripts/pg.sh stop' EXIT
fi
.venv/bin/python -m pytest -q -p no:cacheprovider "${fast[@]}" "$@"
