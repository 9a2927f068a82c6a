"""Served against offline throughput of one recipe, side by side in this one run, and the load test's table.

    python scripts/bench_serve.py RECIPE [--rounds 7] [--port 8765] [--levels 1,4,8,16,32] [--no-trial]
                                         [--compare-tree PATH]

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
once.

--compare-tree PATH adds a second server and a second offline process that import autotune from another checkout
(PYTHONPATH=PATH, e.g. a `git worktree` of an older commit): every round then runs all four, in rotating order, so
that two versions of the serving stack and of the engine are compared side by side, each against its own offline
figure and against each other."""
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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from autotune.backends import get_backend  # noqa: E402
from autotune.benchmark.bench import benchmark_engine  # noqa: E402
from autotune.benchmark.peak_rss import rss_bytes  # noqa: E402
from autotune.benchmark.policy import RunPolicy  # noqa: E402
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_record import compare, machine, spread, write  # noqa: E402
from bench_tables import serve_table  # noqa: E402


def _offline_worker(recipe: Recipe) -> int:
    """The offline process: the served engine, built once; a timed benchmark run of the workload per input line."""
    base_rss = rss_bytes()
    engine, tokenizer, _ = engine_for(recipe, place(recipe), check_weights=False)
    workload = Workload(**recipe.data["workload"])
    prompts = bench_prompts(tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max,
                            workload.seed)
    # The first run warms up as a trial of a compiled build does (one whole run: every graph shape met once); later
    # runs only touch the kernels again (a few tokens). One timed run of the whole workload each.
    policy = RunPolicy(warmup="full", max_repeats=1)
    print("ready", flush=True)
    for _ in sys.stdin:
        figures = benchmark_engine(engine, prompts, workload, policy=policy, base_rss=base_rss)
        policy = RunPolicy(warmup="short", max_repeats=1)
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


def _env(tree: str | None) -> dict[str, str] | None:
    """The environment of a process that imports autotune from `tree` (None: this checkout's, as installed). The
    process also runs in `tree` (cwd=tree): `python -m` puts the working directory before PYTHONPATH."""
    return None if tree is None else {**os.environ, "PYTHONPATH": tree}


class _Offline:
    """The offline process, driven one timed run at a time; its log lines are echoed."""

    def __init__(self, recipe: str, tree: str | None = None, label: str = "offline") -> None:
        self.label = label
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), os.path.abspath(recipe),
                                      "--offline-worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=_env(tree), cwd=tree)
        _echo_until(self.proc, label, lambda line: line == "ready")

    def run(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        return json.loads(_echo_until(self.proc, self.label, lambda line: line.startswith("{")))

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _serve(recipe: str, port: int, tree: str | None = None, label: str = "serve") -> subprocess.Popen:
    """`autotune serve` in its own process; returns once it prints that it is serving (build and warm-up done)."""
    proc = subprocess.Popen([sys.executable, "-m", "autotune.cli", "serve", os.path.abspath(recipe), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(tree),
                            cwd=tree)
    print(f"  {label}:", _echo_until(proc, label, lambda line: line.startswith("serving ")), flush=True)
    return proc


def _engine_counters(port: int) -> tuple[float, float]:
    """The server's engine steps and seconds spent in them so far (GET /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    # Either naming: prometheus_client's (autotune:...) or the hand-formatted exposition's of older checkouts.
    found = (re.search(rf"^autotune[:_]{name} (\S+)$", text, re.M) for name in
             ("engine_steps_total", "engine_busy_seconds_total"))
    return tuple(float(m.group(1)) for m in found)  # type: ignore[union-attr,return-value]


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


class _Version:
    """One version of the stack under test: its server, its offline process, and what each of its runs measured."""

    def __init__(self, name: str, tree: str | None, port: int) -> None:
        self.name, self.tree, self.port = name, tree, port
        self.server: subprocess.Popen | None = None
        self.offline: _Offline | None = None
        self.offline_runs: list[dict] = []
        self.served_runs: list[dict] = []
        self.engine: list[str] = []
        self.start_s: float | None = None

    def start_server(self, recipe: str) -> None:
        started = time.perf_counter()
        self.server = _serve(recipe, self.port, self.tree, f"serve {self.name}")
        self.start_s = time.perf_counter() - started
        print(f"{self.name} server up in {self.start_s:.0f} s", flush=True)

    def record(self) -> dict:
        """This version's medians and ranges and the order its rounds allow (bench_record); its runs are the
        record's `rounds`."""
        off = [o["throughput_tok_s"] for o in self.offline_runs]
        on = [s["throughput_tok_s"] for s in self.served_runs]
        return {"tree": self.tree or "this checkout", "offline": spread(off), "served": spread(on),
                "ratio": round(statistics.median(on) / statistics.median(off), 3),
                "round_ratios": [round(b / a, 3) for a, b in zip(off, on)], "order": compare(on, off),
                "tpot_p50_ms": {"offline": statistics.median(o["tpot_p50_ms"] for o in self.offline_runs),
                                "served": statistics.median(s["tpot_ms"]["p50"] for s in self.served_runs)},
                "server_start_s": self.start_s, "engine_per_served_run": self.engine}

    def run(self, kind: str, config, workload: Workload, prompts: list[str]) -> float:
        if kind == "offline":
            assert self.offline is not None
            self.offline_runs.append(self.offline.run())
            return self.offline_runs[-1]["throughput_tok_s"]
        before = _engine_counters(self.port)
        self.served_runs.append(run_loadtest(f"http://127.0.0.1:{self.port}", prompts, [config.batch_size],
                                             workload.num_requests, workload.output_tokens)["levels"][0])
        steps, busy = (b - a for a, b in zip(before, _engine_counters(self.port)))
        # The counters also hold the load test's one warm-up request, sent before the timed level.
        self.engine.append(f"{steps:.0f} steps, {busy:.2f} s busy")
        return self.served_runs[-1]["throughput_tok_s"]

    def close(self) -> None:
        if self.offline is not None:
            self.offline.close()
        if self.server is not None:
            self.server.terminate()
            self.server.wait(timeout=60)

    def summary(self, label: str) -> tuple[float, float, float, float]:
        off = statistics.median(o["throughput_tok_s"] for o in self.offline_runs)
        on = statistics.median(s["throughput_tok_s"] for s in self.served_runs)
        off_tpot = statistics.median(o["tpot_p50_ms"] for o in self.offline_runs)
        on_tpot = statistics.median(s["tpot_ms"]["p50"] for s in self.served_runs)
        print(f"{label}")
        print("| figure | offline benchmark | served (HTTP, streaming, concurrency = batch size) | ratio |")
        print("|---|---|---|---|")
        print(f"| throughput (tok/s) | {off:.1f} | {on:.1f} | **{on / off:.2f}** |")
        print(f"| TPOT p50 (ms) | {off_tpot:.1f} | {on_tpot:.1f} | {on_tpot / off_tpot:.2f} |")
        off_t = [o["throughput_tok_s"] for o in self.offline_runs]
        on_t = [s["throughput_tok_s"] for s in self.served_runs]
        print(f"offline runs: {[round(x, 1) for x in off_t]}; served: {[round(x, 1) for x in on_t]}; ratio per "
              f"round: {[round(b / a, 2) for a, b in zip(off_t, on_t)]}")
        print(f"server's engine per served run (with the client's warm-up request): {'; '.join(self.engine)}")
        return off, on, off_tpot, on_tpot


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--levels", default="1,4,8,16,32", help="the load test's levels after the rounds ('' : none)")
    parser.add_argument("--no-trial", action="store_true", help="skip the trial's own offline figure")
    parser.add_argument("--compare-tree", default=None, metavar="PATH",
                        help="another checkout of autotune to measure side by side (its server and offline process)")
    parser.add_argument("--client-nice", type=int, default=0, metavar="N",
                        help="run the load test's client (this process, once the servers and offline processes are "
                             "up) at this niceness: a client on another machine takes no cycles from the server")
    parser.add_argument("--offline-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    recipe = load_recipe(args.recipe)
    if args.offline_worker:
        return _offline_worker(recipe)
    config, workload = recipe.config, Workload(**recipe.data["workload"])
    tokenizer = load_tokenizer(resolve_model(recipe.model))
    prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in bench_prompts(
        tokenizer, workload.num_requests, workload.prompt_min, workload.prompt_max, workload.seed)]
    versions = [_Version("this", None, args.port)]
    if args.compare_tree:
        versions.append(_Version("other", os.path.abspath(args.compare_tree), args.port + 1))
    trial = None
    try:
        for v in versions:
            v.start_server(args.recipe)
        if not args.no_trial:
            print("the offline benchmark as a trial runs it (build, gate, 3 timed runs)", flush=True)
            if (trial := _trial_figure(recipe, workload)) is None:
                return 1
            print(f"  {trial['throughput_tok_s']:.1f} tok/s", flush=True)
        for v in versions:
            print(f"offline process ({v.name}): build and warm up", flush=True)
            v.offline = _Offline(args.recipe, v.tree, f"offline {v.name}")
        if args.client_nice:
            os.nice(args.client_nice)  # this process only: the servers and offline processes started before it
            print(f"client at niceness {args.client_nice}", flush=True)
        kinds = [(v, kind) for v in versions for kind in ("offline", "served")]
        for r in range(args.rounds):
            # Rotate the order, so that no kind always runs first or right after the same other.
            order = kinds[r % len(kinds):] + kinds[:r % len(kinds)]
            for v, kind in (order if r % 2 == 0 else order[::-1]):
                figure = v.run(kind, config, workload, prompts)
                print(f"round {r + 1}/{args.rounds} {v.name} {kind}: {figure:.1f} tok/s", flush=True)
        table, levels_run = "", None
        if args.levels:
            print(f"load test at {args.levels}", flush=True)
            # The loadtest's own prompts: 64 of the workload's lengths, as `autotune loadtest` sends them.
            table_prompts = [tokenizer.decode(p, skip_special_tokens=True) for p in bench_prompts(
                tokenizer, 64, workload.prompt_min, workload.prompt_max, 0)]
            for v in versions:
                if v.offline is not None:  # its memory and threads back before the load test
                    v.offline.close()
                    v.offline = None
            levels = [int(x) for x in args.levels.split(",")]
            levels_run = run_loadtest(f"http://127.0.0.1:{args.port}", table_prompts, levels, None,
                                      workload.output_tokens)
            table = format_table(levels_run)
    finally:
        for v in versions:
            v.close()
    print()
    print(f"{recipe.path}: {config.label()}; workload {workload.num_requests} requests, prompts "
          f"{workload.prompt_min}-{workload.prompt_max} tokens, {workload.output_tokens} new tokens; "
          f"{args.rounds} rounds of one offline and one served run per version, medians")
    results = {v.name: v.summary(f"{v.name} ({v.tree or 'this checkout'}):") for v in versions}
    if len(results) == 2:
        (off_a, on_a, _, _), (off_b, on_b, _, _) = results["this"], results["other"]
        print(f"this against other, same rounds: offline {off_a / off_b:.2f}x, served {on_a / on_b:.2f}x")
    if trial is not None:
        print(f"the offline benchmark as a trial measured it before the rounds: {trial['throughput_tok_s']:.1f} tok/s "
              f"(runs {trial['throughput_min']:.1f}-{trial['throughput_max']:.1f})")
    if table:
        print()
        print(table)
    fingerprint = get_backend("cpu").fingerprint()
    record = {"kind": "serve", "machine": machine(fingerprint), "recipe": {
        "path": str(recipe.path), "model": recipe.model, "label": config.label(), "build": (recipe.data.get(
            "deploy") or {}).get("build")}, "workload": recipe.data["workload"],
        "rounds": {v.name: {"offline": v.offline_runs, "served": v.served_runs} for v in versions},
        "versions": {v.name: v.record() for v in versions}, "trial": trial,
        "loadtest": levels_run["levels"] if levels_run else None}
    write(f"bench_serve-{Path(recipe.model).name}-{fingerprint['hardware']}", record)
    print(serve_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
