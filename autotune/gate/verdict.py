"""A gate figure's verdict, stated with its interval: agreement is a proportion of positions, and the same build
scored on another sample of text would score a little differently. The Clopper-Pearson interval is exact (it never
claims more confidence than it has, at any sample size), as Clopper and Pearson (1934) define it from the beta
distribution's quantiles. The decode check's verdict is Wald's (1945) sequential probability ratio test between a
fail point and a pass point around the threshold (autotune/gate/design.py), looked at after each stage; the
interval is reported beside it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import beta

from autotune.gate.design import (
    CONFIDENCE,
    DECODE_ALPHA,
    DECODE_BETA,
    DECODE_FAIL_MISS_RATIO,
    DECODE_PASS_MISS_RATIO,
)

__all__ = ["Verdict", "interval", "judge"]


def interval(agreeing: int, positions: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Two-sided Clopper-Pearson interval of the agreement rate agreeing / positions."""
    if positions <= 0:
        return 0.0, 1.0
    tail = (1 - confidence) / 2
    misses = positions - agreeing
    low = 0.0 if agreeing == 0 else float(beta.ppf(tail, agreeing, misses + 1))
    high = 1.0 if misses == 0 else float(beta.ppf(1 - tail, agreeing + 1, misses))
    return low, high


@dataclass(frozen=True, slots=True)
class Verdict:
    """`decided`: the test reached one of its bounds; otherwise the sample is at its cap and the build is marginal
    (`passed` False: too close to the threshold to tell with the sample the design allows), which `reason` says."""

    passed: bool
    decided: bool
    low: float
    high: float
    reason: str

    @property
    def marginal(self) -> bool:
        return not self.decided


def evidence(agreeing: int, positions: int, threshold: float) -> float:
    """The log-likelihood ratio of the sample under the pass point against the fail point."""
    fail, ok = (1 - threshold) * DECODE_FAIL_MISS_RATIO, (1 - threshold) * DECODE_PASS_MISS_RATIO
    misses = positions - agreeing
    return misses * math.log(ok / fail) + agreeing * math.log((1 - ok) / (1 - fail))


def judge(agreeing: int, positions: int, threshold: float, *, cap_positions: int) -> Verdict | None:
    """The verdict on `positions` scored so far, or None where the test has not reached a bound and the sample may
    still grow (up to `cap_positions`)."""
    low, high = interval(agreeing, positions)
    rate = agreeing / positions
    points = (f"{1 - (1 - threshold) * DECODE_FAIL_MISS_RATIO:.4f} against "
              f"{1 - (1 - threshold) * DECODE_PASS_MISS_RATIO:.4f}")
    seen = f"{rate:.4f} over {positions} positions, {CONFIDENCE:.0%} interval [{low:.4f}, {high:.4f}]"
    llr = evidence(agreeing, positions, threshold)
    if llr >= math.log((1 - DECODE_BETA) / DECODE_ALPHA):
        return Verdict(True, True, low, high, f"pass: {seen}; the sequential test ({points}) decided")
    if llr <= math.log(DECODE_BETA / (1 - DECODE_ALPHA)):
        return Verdict(False, True, low, high, f"fail: {seen}; the sequential test ({points}) decided")
    if positions >= cap_positions:
        return Verdict(False, False, low, high, f"marginal: {seen}; the sequential test ({points}) is undecided at "
                                                f"the cap of {cap_positions} positions")
    return None
