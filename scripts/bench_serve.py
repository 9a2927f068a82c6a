"""Served against offline throughput of one recipe, side by side in this one run, and the load test's table.

    python scripts/bench_serve.py RECIPE [--rounds 7] [--port 8765] [--levels 1,4,8,16,32] [--no-trial]

Three processes: `autotune serve RECIPE`; an offline process that builds the same engine once and, each time it is
asked, times one run of the recipe's workload through the benchmark's own code (benchmark_engine: the runner and
requests a trial times); this one, whose `autotune loadtest` client sends the server the same workload (as many
requests, prompts of the same lengths from the same text, as many new tokens) at a concurrency of the batch size.

The rounds put one offline run and one served run seconds apart, in alternating order (offline first, then served
first), and the ratio is of the medians, with each round's own ratio beside it. Why not a trial's whole benchmark
per round: it takes three minutes (build, gate, timed runs), and this machine's speed drifts by 10-20% within
minutes (one server, the same served run: 155 tok/s, 140 right after a trial had run, 135-144 ten minutes later
with nothing else running), so figures taken minutes apart compare two machines. The trial's figure is still
measured once, before the rounds, beside the offline process's (--no-trial skips it). Then the load test's levels
once."""
from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends import get_backend  # noqa: E402
from autotune.benchmark.bench import benchmark_engine  # noqa: E402
from autotune.benchmark.peak_rss import rss_bytes  # noqa: E402
from autotune.config.workload import Workload  # noqa: E402
from autotune.gate.corpus import bench_prompts  # noqa: E402
from autotune.gate.design import GATE_VERSION  # noqa: E402
from autotune.models.registry import resolve_model  # noqa: E402
from autotune.models.weights import load_tokenizer  # noqa: E402
from autotune.recipes.recipe import Recipe, load_recipe  # noqa: E402
from autotune.recipes.target import place  # noqa: E402
from autotune.serve.app import engine_for  # noqa: E402
from autotune.serve.loadtest import format_table, run_loadtest  # noqa: E402
from autotune.trial.job import Job, JobKind  # noqa: E402


def _offline_worker(recipe: Recipe) -> int:
    """The offline process: the served engine, built once; a timed benchmark run of the workload per input line."""
    base_rss = rss_bytes()
    engine, tokenizer, _ = engine_for(recipe, place(recipe), check_weights=False)
    workload = Workload(**recipe.data["workload"])
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    warmup = 2  # as a trial's benchmark: compile and settle before the first timed run
    print("ready", flush=True)
    for _ in sys.stdin:
        figures = benchmark_engine(engine, prompts, workload, repeats=1, warmup=warmup, base_rss=base_rss)
        warmup = 0
        print(json.dumps(figures), flush=True)
    return 0


def _echo_until(proc: subprocess.Popen, label: str, done) -> str:
    """Echo `proc`'s output lines under `label` until one satisfies `done`, which is returned, not echoed."""
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        if done(line):
            return line
        print(f"  {label}:", line, flush=True)
    raise SystemExit(f"the {label} process exited ({proc.wait()})")


class _Offline:
    """The offline process, driven one timed run at a time; its log lines are echoed."""

    def __init__(self, recipe: str) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, recipe, "--offline-worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _echo_until(self.proc, "offline", lambda line: line == "ready")

    def run(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return json.loads(_echo_until(self.proc, "offline", lambda line: line.startswith("{")))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _serve(recipe: str, port: int) -> subprocess.Popen:
    """`autotune serve` in its own process; returns once it prints that it is serving (build and warm-up done)."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", recipe, "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print("  serve:", _echo_until(proc, "serve", lambda line: line.startswith("serving ")), flush=True)
    return proc


def _engine_counters(port: int) -> tuple[float, float]:
    """The server's engine steps and seconds spent in them so far (GET /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return tuple(float(re.search(rf"^{name} (\S+)$", text, re.M).group(1))  # type: ignore[union-attr,return-value]
                 for name in ("autotune:engine_steps_total", "autotune:engine_busy_seconds_total"))


def _trial_figure(recipe: Recipe, workload: Workload) -> dict | None:
    """The offline benchmark as a trial measures it: its own process, build, gate, 3 timed runs, medians."""
    config = recipe.config
    # The recipe's teacher-forced figures stand in for the windows only where today's gate measured them; the
    # decode check runs either way (it is of this batch and page size).
    gate = recipe.data["gate"] if str((recipe.data["gate"] or {}).get("version")) == GATE_VERSION else None
    job = Job(kind=JobKind.TRIAL, model=recipe.model, workload=workload.to_dict(), config=config.to_dict(),
              threads=config.device_power, gate=gate, repeats=3)
    result = get_backend("cpu").run(job, 1800)
    if not result.ok:
        print("the trial failed:", result.reason, *(result.log_tail or [])[-5:], sep="\n")
        return None
    return result.bench


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--levels", default="1,4,8,16,32")
    parser.add_argument("--no-trial", action="store_true", help="skip the trial's own offline figure")
    parser.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    if args.offline_worker:
        return _offline_worker(recipe)
    config, workload = recipe.config, Workload(**recipe.data["workload"])
    tokenizer = load_tokenizer(resolve_model(recipe.model))
    prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in bench_prompts(
        tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)]
    url = f"http://127.0.0.1:{args.port}"
    started = time.perf_counter()
    server = _serve(args.recipe, args.port)
    print(f"server up in {time.perf_counter() - started:.0f} s", flush=True)
    offline: list[dict] = []
    served: list[dict] = []
    engine: list[str] = []
    trial = None
    try:
        if not args.no_trial:
            print("the offline benchmark as a trial runs it (build, gate, 3 timed runs)", flush=True)
            if (trial := _trial_figure(recipe, workload)) is None:
                return 1
            print(f"  {trial['throughput_tok_s']:.1f} tok/s", flush=True)
        print("offline process: build and warm up", flush=True)
        worker = _Offline(args.recipe)
        try:
            for r in range(args.rounds):
                for kind in ("offline", "served") if r % 2 == 0 else ("served", "offline"):
                    if kind == "offline":
                        offline.append(worker.run())
                        figure = offline[-1]["throughput_tok_s"]
                    else:
                        before = _engine_counters(args.port)
                        served.append(run_loadtest(url, prompts, [config.batch_size], workload.num_requests,
                                                   workload.output_tokens)["levels"][0])
                        steps, busy = (b - a for a, b in zip(before, _engine_counters(args.port)))
                        # The counters also hold the load test's one warm-up request, sent before the timed level.
                        engine.append(f"{steps:.0f} steps, {busy:.2f} s busy")
                        figure = served[-1]["throughput_tok_s"]
                    print(f"round {r + 1}/{args.rounds} {kind}: {figure:.1f} tok/s", flush=True)
        finally:
            worker.close()
        levels = [int(x) for x in args.levels.split(",")]
        print(f"load test at {args.levels}", flush=True)
        # The loadtest's own prompts: 64 of the workload's lengths, as `autotune loadtest` sends them.
        table_prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in bench_prompts(
            tokenizer, 64, workload.prompt_min, workload.prompt_max, 0)]
        table = format_table(run_loadtest(url, table_prompts, levels, None, workload.output_tokens))
    finally:
        server.terminate()
        server.wait(timeout=60)
    off_tput = [o["throughput_tok_s"] for o in offline]
    on_tput = [s["throughput_tok_s"] for s in served]
    off, on = statistics.median(off_tput), statistics.median(on_tput)
    off_tpot = statistics.median(o["tpot_p50_ms"] for o in offline)
    on_tpot = statistics.median(s["tpot_ms"]["p50"] for s in served)
    print()
    print(f"{recipe.path}: {config.label()}; workload {workload.num_requests} requests, prompts "
          f"{workload.prompt_min}-{workload.prompt_max} tokens, {workload.output_tokens} new tokens; "
          f"{args.rounds} rounds of one offline and one served run, medians")
    print("| figure | offline benchmark | served (HTTP, streaming, concurrency = batch size) | ratio |")
    print("|---|---|---|---|")
    print(f"| throughput (tok/s) | {off:.1f} | {on:.1f} | **{on / off:.2f}** |")
    print(f"| TPOT p50 (ms) | {off_tpot:.1f} | {on_tpot:.1f} | {on_tpot / off_tpot:.2f} |")
    print(f"offline runs: {[round(x, 1) for x in off_tput]}; served: {[round(x, 1) for x in on_tput]}; ratio per "
          f"round: {[round(b / a, 2) for a, b in zip(off_tput, on_tput)]}")
    if trial is not None:
        print(f"the offline benchmark as a trial measured it before the rounds: {trial['throughput_tok_s']:.1f} tok/s "
              f"(runs {trial['throughput_min']:.1f}-{trial['throughput_max']:.1f})")
    print(f"server's engine per served run (with the client's warm-up request): {'; '.join(engine)}")
    print()
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
