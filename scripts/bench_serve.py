"""Served against offline throughput of one recipe, side by side in this one run, and the load test's table.

    python scripts/bench_serve.py RECIPE [--rounds 2] [--port 8765] [--levels 1,4,8,16,32]

Offline: the recipe's configuration benchmarked as a trial measures it (its own process: build, warm-up, 3 timed
runs of the recipe's workload, medians; the recipe's gate figures are reused). Served: `autotune serve RECIPE` in
its own process, loaded by `autotune loadtest`'s client from this process with the same workload (as many
requests, prompts of the same lengths from the same text, as many new tokens, at a concurrency of the batch size).
The two alternate `--rounds` times on a server that stays up, so that drifts of the machine hit both alike; the
ratio is of medians. Then the load test's levels once, as `autotune loadtest` prints them."""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends import get_backend  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.gate.corpus import bench_prompts  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_tokenizer  # noqa: E402
from autotune.recipes.recipe import load_recipe  # noqa: E402
from autotune.serve.loadtest import format_table, run_loadtest  # noqa: E402
from autotune.trial.job import Job, JobKind  # noqa: E402


def _serve(recipe: str, port: int) -> subprocess.Popen:
    """`autotune serve` in its own process; returns once it prints that it is serving (build and warm-up done)."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", recipe, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print("  serve:", line.rstrip(), flush=True)
        if line.startswith("serving "):
            return proc
    raise SystemExit(f"autotune serve exited ({proc.wait()}) before serving")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--levels", default="1,4,8,16,32")
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    config, workload = recipe.config, Workload(**recipe.data["workload"])
    tokenizer = load_tokenizer(resolve_model(recipe.model))
    prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in bench_prompts(
        tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)]
    job = Job(kind=JobKind.TRIAL, model=recipe.model, workload=workload.to_dict(), config=config.to_dict(),
              threads=config.device_power, gate=recipe.data["gate"], repeats=3)
    backend = get_backend("cpu")
    url = f"http://127.0.0.1:{args.port}"
    started = time.perf_counter()
    server = _serve(args.recipe, args.port)
    print(f"server up in {time.perf_counter() - started:.0f} s", flush=True)
    offline, served, served_tpot = [], [], []
    try:
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}: offline benchmark", flush=True)
            result = backend.run(job, 1800)
            if not result.ok:
                print("failed:", result.reason, *(result.log_tail or [])[-5:], sep="\n")
                return 1
            offline.append(result.bench)
            print(f"  {result.bench['throughput_tok_s']:.1f} tok/s", flush=True)
            print(f"round {r + 1}/{args.rounds}: served, concurrency {config.batch_size}", flush=True)
            level = run_loadtest(url, prompts, [config.batch_size], workload.num_requests,
                                 workload.output_tokens)["levels"][0]
            served.append(level["throughput_tok_s"])
            served_tpot.append(level["tpot_ms"]["p50"])
            print(f"  {level['throughput_tok_s']:.1f} tok/s, {level['errors']} errors", flush=True)
        levels = [int(x) for x in args.levels.split(",")]
        print(f"load test at {args.levels}", flush=True)
        # The loadtest's own prompts: 64 of the workload's lengths, as `autotune loadtest` sends them.
        table_prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in bench_prompts(
            tokenizer, 64, workload.prompt_min, workload.prompt_max, 0)]
        table = format_table(run_loadtest(url, table_prompts, levels, None, workload.output_tokens))
    finally:
        server.terminate()
        server.wait(timeout=60)
    off = statistics.median(r["throughput_tok_s"] for r in offline)
    on = statistics.median(served)
    print()
    print(f"{recipe.path}: {config.label()}; workload {workload.num_requests} requests, prompts "
          f"{workload.prompt_min}-{workload.prompt_max} tokens, {workload.output_tokens} new tokens; "
          f"{args.rounds} alternating rounds, medians")
    print("| figure | offline benchmark | served (HTTP, streaming, concurrency = batch size) | ratio |")
    print("|---|---|---|---|")
    print(f"| throughput (tok/s) | {off:.1f} | {on:.1f} | **{on / off:.2f}** |")
    tpot = statistics.median(r["tpot_p50_ms"] for r in offline)
    print(f"| TPOT p50 (ms) | {tpot:.1f} | {statistics.median(served_tpot):.1f} | "
          f"{statistics.median(served_tpot) / tpot:.2f} |")
    print(f"offline runs: {[round(r['throughput_tok_s'], 1) for r in offline]}; served: "
          f"{[round(x, 1) for x in served]}")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
