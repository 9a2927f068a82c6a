"""Goodput: the highest request rate at which at least the SLO's attainment share of requests meets both its TTFT and
its TPOT limit (DistServe, OSDI'24). Found by a rate search of open-loop runs (benchmark/open_loop.py): from a start
rate (the offline throughput in requests per second: the most the engine serves when it is never idle), double
while the target is met or halve until it is, then bisect between the highest rate met and the lowest missed, in
geometric steps, until they are within PRECISION of each other or the time budget is spent. A probe sends as many
requests as arrive in half the budget at its rate, between MIN_PROBE_REQUESTS and PROBE_REQUESTS. Every rate tried is
kept with its attainment and interval."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace

from autotune.benchmark.open_loop import OpenLoopRun, run_open_loop
from autotune.config.arrival import load_requests
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.engine.peer import StepRunner
from autotune.progress import log

__all__ = ["find_goodput", "measure_goodput", "search_probes", "goodput_workload", "PRECISION", "PROBE_REQUESTS"]

PRECISION = 0.1  # the search ends when the highest rate met and the lowest missed are within 10%
MAX_DOUBLINGS = 3  # above the start rate: the offline throughput is already the engine's saturated rate
MAX_HALVINGS = 5  # below it: at 1/32 of its saturated rate an engine that still misses cannot meet the SLO
PROBE_REQUESTS = 40  # per rate at most: with 4 warm-up requests, 36 counted; at a 0.9 target, 3 may miss
MIN_PROBE_REQUESTS = 20  # per rate at least: 2 warm-up, 18 counted, 1 may miss at 0.9


def goodput_workload(workload: Workload, rate: float, requests: int = PROBE_REQUESTS) -> Workload:
    """The open-loop workload of one probe: the trial's prompt lengths, Poisson arrival at `rate`, and output
    lengths drawn around the offline workload's (uniform from half to all of its `output_tokens`, unless the
    workload draws its own)."""
    out_min = workload.output_min if workload.output_min is not None else max(1, workload.output_tokens // 2)
    return replace(workload, num_requests=requests, arrival="poisson", rate=rate, output_min=out_min)


def find_goodput(measure: Callable[[float], OpenLoopRun], start_rate: float, slo: Slo, *, budget_s: float,
                 clock: Callable[[], float] = time.perf_counter,
                 report: Callable[[str], None] | None = log) -> dict:
    """The rate search over `measure(rate)`. A probe is skipped once the budget is spent (the first two always
    run: a figure needs a met and a missed rate, or the start and its half). `report` gets a line per probe (None:
    the simulator's probes, dozens per guided pick, say nothing)."""
    if not start_rate > 0:
        raise ValueError(f"the rate search needs a start rate above 0, not {start_rate}")
    started = clock()
    runs: list[OpenLoopRun] = []

    def probe(rate: float) -> bool:
        run = measure(rate)
        runs.append(run)
        word = "met" if run.attained else ("missed, stopped early" if run.stopped_early else "missed")
        if report is not None:
            report(f"  goodput: {rate:.3g} req/s: {run.met}/{run.counted} within the SLO ({run.attainment:.0%}), "
                   f"{word}")
        return run.attained

    def time_left() -> bool:
        return len(runs) < 2 or clock() - started < budget_s

    lo: float | None = None
    hi: float | None = None
    if probe(start_rate):
        lo = start_rate
        for _ in range(MAX_DOUBLINGS):
            if not time_left():
                break
            if probe(lo * 2):
                lo *= 2
            else:
                hi = lo * 2
                break
    else:
        hi = start_rate
        for _ in range(MAX_HALVINGS):
            if not time_left():
                break
            if probe(hi / 2):
                lo = hi / 2
                break
            hi /= 2
    while lo is not None and hi is not None and hi / lo > 1 + PRECISION and time_left():
        mid = math.sqrt(lo * hi)
        if probe(mid):
            lo = mid
        else:
            hi = mid
    seconds = clock() - started
    out = {"slo": slo.to_dict(), "met": lo is not None, "goodput_req_s": lo or 0.0,
           "start_rate": start_rate, "lowest_missed_req_s": hi, "seconds": seconds, "budget_s": budget_s,
           "rates": [r.to_dict() for r in runs]}
    if lo is None:
        best = max(runs, key=lambda r: r.attainment)
        out["best_attainment"] = best.attainment
        out["note"] = (f"no rate tried met the SLO ({slo.label()}): the best was {best.attainment:.0%} at "
                       f"{best.rate:.3g} req/s")
    elif hi is None:
        out["note"] = f"met at every rate tried, up to {lo:.3g} req/s ({2 ** MAX_DOUBLINGS}x the start rate)"
    return out


def search_probes(run: Callable[[Workload], OpenLoopRun], workload: Workload, slo: Slo, start_tok_s: float, *,
                  budget_s: float, probes_before: int = 0) -> dict:
    """The rate search from `start_tok_s` (over the probes' mean output length), each probe's workload drawn from
    `workload` and handed to `run`, which sends it (to a warm runner, to a server over HTTP) and judges it. A probe
    sends as many requests as arrive in half the budget at its rate (the first two probes always run), within the
    bounds, each with its own prompts and arrival draws (seed + the probe's number, counted from `probes_before`): a
    runtime with a prefix cache would otherwise serve every probe after the first from the first one's cache. The
    figure in output tokens per second is the goodput rate times that mean."""
    probe_workload = goodput_workload(workload, 1.0)
    mean_out = probe_workload.mean_output_tokens
    probes = probes_before

    def measure(rate: float) -> OpenLoopRun:
        nonlocal probes
        probes += 1
        n = min(PROBE_REQUESTS, max(MIN_PROBE_REQUESTS, round(rate * budget_s / 2)))
        return run(replace(probe_workload, rate=rate, seed=workload.seed + probes, num_requests=n))

    out = find_goodput(measure, start_tok_s / mean_out, slo, budget_s=budget_s)
    out["goodput_tok_s"] = out["goodput_req_s"] * mean_out
    out["workload"] = {**probe_workload.to_dict(), "rate": "searched"}
    out["probes"] = probes - probes_before
    return out


def measure_goodput(runner: StepRunner, prompts_for: Callable[[Workload], list[list[int]]], workload: Workload,
                    slo: Slo, offline_tok_s: float, *, budget_s: float, eos_token_id: int | None = None) -> dict:
    """Goodput of a warm runner: `prompts_for(workload)` gives a probe's prompts (gate/corpus.bench_prompts), the
    start rate is the offline throughput."""
    def run(w: Workload) -> OpenLoopRun:
        return run_open_loop(runner, load_requests(w, prompts_for(w)), slo, w.rate, eos_token_id=eos_token_id)

    return search_probes(run, workload, slo, offline_tok_s, budget_s=budget_s)
