"""How much a benchmark runs: warm-ups only as many as the build needs, timed repeats bounded by count and by time,
and a stop once the spread is known, so that a machine five times slower does not pay five times the wall time
for the same precision. Every stop records which rule ended it."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from autotune.contention import doubt, load_between, sample

__all__ = ["RunPolicy", "timed_runs", "policy_for", "doubt_of", "DOUBT_PREFIX"]

DOUBT_PREFIX = "doubt: "


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
    why they stopped. `cut(runs)` may end them early with a reason (a clearly dominated configuration).

    Each run carries what other processes took of the machine meanwhile (autotune/contention.py). A run they
    disturbed is measured again and not counted, up to `max_repeats` such runs within the time cap; where no
    undisturbed run was had, the disturbed ones are returned and the stop says "doubt: " and why."""
    runs: list[dict] = []
    disturbed: list[tuple[dict, str]] = []
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        before = sample()
        figures = run()
        figures.update(load_between(before, sample()))
        spent += time.perf_counter() - t0
        reason = doubt(figures)
        if reason is not None:
            disturbed.append((figures, reason))
            log(f"  repeat: {figures['throughput_tok_s']:.1f} tok/s, not counted: {reason}")
            tried = len(runs) + len(disturbed)
            if len(disturbed) >= policy.max_repeats or spent + spent / tried > policy.time_cap_s:
                if runs:
                    return runs, f"disturbed: {len(disturbed)} runs not counted ({reason}); {len(runs)} counted"
                return [f for f, _ in disturbed], f"{DOUBT_PREFIX}{reason}, in all {len(disturbed)} timed runs"
            continue
        runs.append(figures)
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
            tried = n + len(disturbed)
            if spent + spent / tried > policy.time_cap_s:
                return runs, (f"time cap: {n} of {policy.max_repeats} runs took {spent:.0f} s, one more would pass "
                              f"{policy.time_cap_s:.0f} s")


def doubt_of(stop: str) -> str | None:
    """The reason a benchmark's figures are doubted, from timed_runs' stop; None where they are not."""
    return stop.removeprefix(DOUBT_PREFIX) if stop.startswith(DOUBT_PREFIX) else None
