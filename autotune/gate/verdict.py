"""A gate figure's verdict, stated with its interval: agreement is a proportion of positions, and the same build
scored on another sample of text would score a little differently.

The prompt, not the position, is the independent unit of the decode check: once a build's decode drifts inside a
prompt, its next positions tend to miss too, so a prompt's 32 positions carry less than 32 positions' evidence.
How much less is read from the sample itself: the per-prompt misses' variance over the binomial's is the
beta-binomial's design effect 1 + (m - 1) rho (by moments), and every count is divided by it (Kish's effective
sample size; Rao and Scott (1992) adjust binomial tests of clustered data this way). The interval is Clopper and
Pearson's (1934, exact at any sample size) on those effective counts, as Korn and Graubard (1998) do for clustered
samples. The verdict is Wald's (1945) sequential probability ratio test between a fail point and a pass point
around the threshold (autotune/gate/design.py), on the same effective counts: its two bounds hold whenever the test
stops, so the error rates are spent across all the looks at once rather than at each one. A build still undecided
at the cap is marginal: not a pass."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta

from autotune.gate.design import (
    CONFIDENCE,
    DECODE_ALPHA,
    DECODE_BETA,
    DECODE_FAIL_MISS_RATIO,
    DECODE_PASS_MISS_RATIO,
)

__all__ = ["Verdict", "interval", "judge", "evidence", "bounds", "miss_rates", "design_effect"]

# A fail point's miss rate is kept below 1 for thresholds under 1 - 1/DECODE_FAIL_MISS_RATIO (a loose gate, as
# tests set): its likelihood stays finite, and one agreeing position then decides a pass.
_MAX_FAIL_MISS = 0.999


def interval(agreeing: float, positions: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of the agreement rate agreeing / positions (counts may be effective,
    that is, not whole)."""
    if positions <= 0:
        return 0.0, 1.0
    tail = (1 - confidence) / 2
    misses = positions - agreeing
    low = 0.0 if agreeing <= 0 else float(beta.ppf(tail, agreeing, misses + 1))
    high = 1.0 if misses <= 0 else float(beta.ppf(1 - tail, agreeing + 1, misses))
    return low, high


def design_effect(prompt_misses: Sequence[int] | np.ndarray, per_prompt: int) -> np.ndarray:
    """The per-prompt misses' variance over what independent positions would give it (the last axis holds the
    prompts): 1 where misses fall as if independent, up to `per_prompt` where a prompt misses all or nothing.
    Clamped at 1 (a sample that looks more even than independent is not taken as more informative)."""
    misses = np.asarray(prompt_misses, dtype=float)
    if misses.shape[-1] < 2:
        return np.ones(misses.shape[:-1])
    rate = misses.mean(axis=-1) / per_prompt
    binomial = per_prompt * rate * (1 - rate)
    spread = misses.var(axis=-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(binomial > 0, spread / binomial, 1.0)
    return np.clip(ratio, 1.0, per_prompt)


def miss_rates(threshold: float) -> tuple[float, float]:
    """The fail point's and the pass point's miss rates: DECODE_FAIL_MISS_RATIO and DECODE_PASS_MISS_RATIO times
    what the threshold allows."""
    allowed = 1 - threshold
    return min(allowed * DECODE_FAIL_MISS_RATIO, _MAX_FAIL_MISS), allowed * DECODE_PASS_MISS_RATIO


def bounds() -> tuple[float, float]:
    """Wald's fail and pass bounds on the log-likelihood ratio, for error rates DECODE_ALPHA (a build at the fail
    point passes) and DECODE_BETA (one at the pass point does not)."""
    return math.log(DECODE_BETA / (1 - DECODE_ALPHA)), math.log((1 - DECODE_BETA) / DECODE_ALPHA)


def evidence(agreeing, positions, threshold: float, effect=1.0):
    """The log-likelihood ratio of the sample under the pass point against the fail point, each count divided by
    the design effect. Takes numbers or numpy arrays alike (scripts/gate_pass_probability.py)."""
    fail, ok = miss_rates(threshold)
    misses = positions - agreeing
    return (misses * math.log(ok / fail) + agreeing * math.log((1 - ok) / (1 - fail))) / effect


@dataclass(frozen=True, slots=True)
class Verdict:
    """`decided`: the test reached one of its bounds; otherwise the sample is at its cap and the build is marginal
    (`passed` False: too close to the threshold to tell with the sample the design allows), which `reason` says.
    `low`, `high`: the interval on the effective counts; `effect`: the design effect they were divided by."""

    passed: bool
    decided: bool
    low: float
    high: float
    reason: str
    effect: float = 1.0

    @property
    def marginal(self) -> bool:
        return not self.decided


def judge(agreeing: int, positions: int, threshold: float, *, cap_positions: int, effect: float = 1.0
          ) -> Verdict | None:
    """The verdict on `positions` scored so far, or None where the test has not reached a bound and the sample may
    still grow (up to `cap_positions`). `effect`: the sample's design effect (design_effect)."""
    low, high = interval(agreeing / effect, positions / effect)
    rate = agreeing / positions
    fail, ok = miss_rates(threshold)
    seen = (f"{rate:.4f} over {positions} positions (design effect {effect:.2f}), {CONFIDENCE:.0%} interval "
            f"[{low:.4f}, {high:.4f}]")
    test = f"the sequential test ({1 - fail:.4f} against {1 - ok:.4f})"
    if threshold >= 1:  # nothing exceeds an agreement of 1
        return Verdict(False, True, low, high, f"fail: {seen}; no agreement exceeds {threshold}", effect)
    llr = evidence(agreeing, positions, threshold, effect)
    to_fail, to_pass = bounds()
    if llr >= to_pass:
        return Verdict(True, True, low, high, f"pass: {seen}; {test} decided", effect)
    if llr <= to_fail:
        return Verdict(False, True, low, high, f"fail: {seen}; {test} decided", effect)
    if positions >= cap_positions:
        return Verdict(False, False, low, high, f"marginal: {seen}; {test} is undecided at the cap of "
                                                f"{cap_positions} positions", effect)
    return None
