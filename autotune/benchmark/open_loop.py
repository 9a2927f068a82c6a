"""An open-loop load on a step runner (engine/peer.py StepRunner: the runner `autotune serve`'s engine loop drives,
with its scheduler, continuous batching and prefill chunk; or OpenVINO's pipeline): each request is submitted at its
arrival time whatever the engine's state, and timed from that time, not from when the engine got to it (no
coordinated omission). One thread submits and steps, as the engine loop does, so no other thread preempts the
step's OpenMP workers.

The first `warmup` requests run but are not counted (the queue fills from empty). The run stops early where its
verdict is known: once more counted requests have missed the SLO (a request that has waited past the TTFT limit
without a token has missed, finished or not) than the attainment target allows. What was still queued or running
then is cancelled, so that the runner is empty for the next run."""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.benchmark.bench import percentile
from autotune.config.arrival import LoadRequest
from autotune.config.slo import Slo
from autotune.engine.peer import StepRunner
from autotune.engine.sequence import Completion, Request

__all__ = ["OpenLoopRun", "run_open_loop", "wilson_interval", "WARMUP_SHARE"]

# The share of a run's requests (rounded up) that fills the system before counting starts.
WARMUP_SHARE = 0.1
# Steps that cancelled requests get to leave the runner after an early stop (one is enough for autotune's runner;
# a peer's counts may lag a step).
DRAIN_STEPS = 8
# A request this close to its due time is due: a sleep until it may wake a rounding error short of it.
_EARLY_S = 1e-6


def wilson_interval(met: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a share `met`/`n` (sound at 0 and 1, unlike the normal approximation)."""
    if n == 0:
        return 0.0, 1.0
    p = met / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(slots=True)
class OpenLoopRun:
    """What one run at one rate found. `attainment` is over the counted requests that were decided (all of them
    unless it `stopped_early`); `queue_growth`: requests waiting at the last arrival minus at the first counted
    one (a saturated engine's queue grows through the run)."""

    rate: float
    counted: int
    met: int
    missed: int
    attained: bool
    attainment: float
    interval: tuple[float, float]
    stopped_early: bool
    seconds: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    output_tok_s: float
    queue_growth: int

    def to_dict(self) -> dict:
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in
                ((f, getattr(self, f)) for f in self.__slots__)}


def _percentile(values: list[float], q: float) -> float | None:
    return percentile(values, q) if values else None


def run_open_loop(runner: StepRunner, load: list[LoadRequest], slo: Slo, rate: float, *,
                  eos_token_id: int | None = None, clock: Callable[[], float] = time.perf_counter,
                  sleep: Callable[[float], None] = time.sleep, warmup: int | None = None) -> OpenLoopRun:
    """Drive `runner` with `load` (arrival order, `due` seconds from the start) until every request has ended or
    the verdict is known; `rate` is the load's nominal rate, recorded. `clock`/`sleep`: the time source (a test's
    virtual clock)."""
    n = len(load)
    warmup = math.ceil(WARMUP_SHARE * n) if warmup is None else warmup
    counted = n - warmup
    allowed = math.floor((1 - slo.attainment) * counted + 1e-9)  # misses the target still allows
    completions: list[Completion | None] = [None] * n
    decided: dict[int, bool] = {}  # counted request -> met
    start = clock()
    submitted = 0
    queue_marks: list[int] = []
    stopped = False
    while True:
        now = clock() - start
        while submitted < n and load[submitted].due <= now + _EARLY_S:
            r = load[submitted]
            req = Request(list(r.prompt_ids), r.new_tokens, min_new_tokens=r.new_tokens, eos_token_id=eos_token_id)
            completions[submitted] = runner.submit(req, arrival=start + r.due)
            if submitted in (warmup, n - 1):
                queue_marks.append(runner.num_waiting)
            submitted += 1
        for i in range(warmup, submitted):
            if i in decided:
                continue
            c = completions[i]
            if c.finish_reason:
                decided[i] = slo.met(c.ttft * 1e3 if c.token_times else None,
                                     c.tpot * 1e3 if c.tpot is not None else None)
            elif not c.token_times and (now - load[i].due) * 1e3 > slo.ttft_ms:
                decided[i] = False  # waited past the TTFT limit without a token: a miss however it ends
        missed = sum(not m for m in decided.values())
        if missed > allowed and len(decided) < counted:
            stopped = True
            break
        live = sum(1 for c in completions[:submitted] if not c.finish_reason)
        if submitted == n and not live:
            break
        if not live:
            sleep(max(0.0, load[submitted].due - (clock() - start)))
            continue
        runner.step()
    seconds = clock() - start
    if stopped:
        for c in completions[:submitted]:
            if not c.finish_reason:
                c.finish_reason = "cancelled"
        for _ in range(DRAIN_STEPS):  # a cancelled request leaves at the runner's next step
            if not (runner.num_waiting or runner.num_running):
                break
            runner.step()
    met = sum(decided.values())
    decided_n = len(decided)
    done = [completions[i] for i in decided if completions[i].token_times]
    ttft = [c.ttft * 1e3 for c in done]
    tpot = [c.tpot * 1e3 for c in done if c.tpot is not None]
    tokens = sum(len(c.output_ids) for c in completions[:submitted] if c is not None)
    return OpenLoopRun(
        rate=rate, counted=decided_n, met=met, missed=decided_n - met,
        attained=met >= slo.attainment * counted - 1e-9 and not stopped,
        attainment=met / decided_n if decided_n else 0.0, interval=wilson_interval(met, decided_n),
        stopped_early=stopped, seconds=seconds, ttft_p50_ms=_percentile(ttft, 0.5), ttft_p99_ms=_percentile(ttft, 0.99),
        tpot_p50_ms=_percentile(tpot, 0.5), tpot_p99_ms=_percentile(tpot, 0.99),
        output_tok_s=tokens / seconds if seconds > 0 else 0.0,
        queue_growth=(queue_marks[-1] - queue_marks[0]) if len(queue_marks) == 2 else 0)
