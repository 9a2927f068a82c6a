"""How much a benchmark runs: warm-ups only as many as the build needs, timed repeats bounded by count and by time,
and a stop once the spread is known, so that a machine five times slower does not pay five times the wall time
for the same precision. Every stop records which rule ended it."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["RunPolicy", "timed_runs", "policy_for"]


@dataclass(frozen=True, slots=True)
class RunPolicy:
    """`warmup`: "short" (one run of a few tokens: eager kernels need no more than their first call) or "full"
    (one whole run: a compiled build meets every graph shape of the timed runs once). `screen`: a first timed run
    of one wave (batch_size requests) that the study's front may cut before the whole workload runs.
    Timed runs of the whole workload: at least `min_repeats`, at most `max_repeats`; a run starts only while the
    timed runs so far plus one more stay within `time_cap_s`; after two runs within `spread_tol` of each other
    (relative to the faster), the spread is known and the runs stop."""

    warmup: str = "full"
    screen: bool = False
    min_repeats: int = 1
    max_repeats: int = 3
    spread_tol: float = 0.05
    time_cap_s: float = 60.0

    def __post_init__(self) -> None:
        if self.warmup not in ("short", "full"):
            raise ValueError(f"warmup must be short or full, not {self.warmup!r}")
        if not 1 <= self.min_repeats <= self.max_repeats:
            raise ValueError(f"need 1 <= min_repeats <= max_repeats, not {self.min_repeats}, {self.max_repeats}")


def policy_for(fusion_level: str, max_repeats: int, time_cap_s: float = 60.0, screen: bool = False) -> RunPolicy:
    """A trial's policy: eager builds warm up briefly, compiled ones once over the whole workload."""
    return RunPolicy(warmup="short" if fusion_level == "O0" else "full", screen=screen,
                     max_repeats=max_repeats, time_cap_s=time_cap_s)


def timed_runs(run: Callable[[], dict], policy: RunPolicy, log: Callable[[str], None],
               cut: Callable[[list[dict]], str | None] | None = None) -> tuple[list[dict], str]:
    """Run `run()` (one timed run's figures, with "throughput_tok_s") as the policy allows; returns the runs and
    why they stopped. `cut(runs)` may end them early with a reason (a clearly dominated configuration)."""
    runs: list[dict] = []
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        runs.append(run())
        spent += time.perf_counter() - t0
        n = len(runs)
        log(f"  repeat {n}/{policy.max_repeats}: {runs[-1]['throughput_tok_s']:.1f} tok/s")
        if n >= policy.max_repeats:
            return runs, f"count: {n} of {policy.max_repeats} runs"
        if n >= policy.min_repeats:
            if cut is not None:
                reason = cut(runs)
                if reason:
                    return runs, f"cut: {reason}; stopped after {n} of {policy.max_repeats} runs"
            if n >= 2:
                a, b = runs[-2]["throughput_tok_s"], runs[-1]["throughput_tok_s"]
                spread = abs(a - b) / max(a, b)
                if spread <= policy.spread_tol:
                    return runs, (f"spread known: the last two runs within {spread:.1%} (<= {policy.spread_tol:.0%}) "
                                  f"after {n} of {policy.max_repeats}")
            if spent + spent / n > policy.time_cap_s:
                return runs, (f"time cap: {n} of {policy.max_repeats} runs took {spent:.0f} s, one more would pass "
                              f"{policy.time_cap_s:.0f} s")
