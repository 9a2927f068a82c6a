"""Trials per minute with 1, 2 and 4 local workers on the simulator backend, where a trial costs next to nothing,
so that the figure is the storage's and the scheduler's overhead; and the per-trial cost of isolation (a child
process per trial) against running the same trials in-process.

    .venv/bin/python scripts/bench_workers.py [--storage URL] [--trials 40]

Storage: --storage, else $AUTOTUNE_TEST_PG_URL (scripts/pg.sh), else a temporary SQLite file."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid

import optuna


def _rate(study: str, url: str) -> tuple[int, float]:
    """(trials, trials per minute) from the trials' own timestamps: process start-up is not counted."""
    trials = [t for t in optuna.load_study(study_name=study, storage=url).trials if t.state.is_finished()]
    start = min(t.datetime_start for t in trials)
    end = max(t.datetime_complete for t in trials)
    return len(trials), len(trials) / max((end - start).total_seconds(), 1e-9) * 60


def _search(url: str, trials: int, workers: int, out: str, *extra: str) -> str:
    study = f"bench-{uuid.uuid4().hex[:8]}"
    cmd = [sys.executable, "-m", "autotune.cli", "search", "--backend", "sim", "--hardware", "a100-80g",
           "--model", "llama-7b", "--study", study, "--storage", url, "--trials", str(trials), "--workers",
           str(workers), "--sampler", "random", "--seed", "0", "--out", out, *extra]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return study


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", default=None)
    parser.add_argument("--trials", type=int, default=40)
    args = parser.parse_args()
    tmp = tempfile.mkdtemp(prefix="autotune-bench-")
    url = args.storage or os.environ.get("AUTOTUNE_TEST_PG_URL") or f"sqlite:///{tmp}/bench.db"
    os.environ.setdefault("AUTOTUNE_CACHE", f"{tmp}/cache")
    from autotune.redact import redact

    print(f"storage {redact(url).split('?')[0]}, {args.trials} trials per run, {os.cpu_count()} CPUs, sim a100-80g")
    print(f"{'workers':>7} {'trials':>6} {'trials/min':>11} {'ms/trial':>9}")
    for workers in (1, 2, 4):
        count, rate = _rate(_search(url, args.trials, workers, f"{tmp}/recipes"), url)
        print(f"{workers:>7} {count:>6} {rate:>11.0f} {60_000 / rate:>9.1f}")
    inproc = _rate(_search(url, args.trials, 1, f"{tmp}/recipes"), url)[1]
    isolated = _rate(_search(url, args.trials, 1, f"{tmp}/recipes", "--isolate"), url)[1]
    overhead = 60_000 / isolated - 60_000 / inproc
    print(f"isolation: in-process {60_000 / inproc:.1f} ms/trial, isolated {60_000 / isolated:.1f} ms/trial: "
          f"{overhead:.0f} ms per trial for the child process")
    return 0


if __name__ == "__main__":
    started = time.perf_counter()
    code = main()
    print(f"({time.perf_counter() - started:.0f} s)")
    sys.exit(code)
