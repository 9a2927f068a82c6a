"""A gate figure's verdict, stated with its interval: agreement is a proportion of positions, and the same build
scored on another sample of text would score a little differently. The Clopper-Pearson interval is exact (it never
claims more confidence than it has, at any sample size), as Clopper and Pearson (1934) define it from the beta
distribution's quantiles."""
from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import beta

from autotune.gate.design import CONFIDENCE

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
    """`decided`: the interval lies on one side of the threshold (or no sample at the cap could pass); otherwise
    the sample is at its cap and the verdict is the point estimate's, which `reason` says."""

    passed: bool
    decided: bool
    low: float
    high: float
    reason: str


def judge(agreeing: int, positions: int, threshold: float, *, cap_positions: int) -> Verdict | None:
    """The verdict on `positions` scored so far, or None where the interval straddles the threshold and the sample
    may still grow (up to `cap_positions`). A pass needs agreement > threshold."""
    low, high = interval(agreeing, positions)
    rate = agreeing / positions
    if low > threshold:
        return Verdict(True, True, low, high, f"pass: {CONFIDENCE:.0%} interval [{low:.4f}, {high:.4f}] above "
                                              f"{threshold}")
    if high <= threshold:
        return Verdict(False, True, low, high, f"fail: {CONFIDENCE:.0%} interval [{low:.4f}, {high:.4f}] at or "
                                               f"below {threshold}")
    misses, allowed = positions - agreeing, (1 - threshold) * cap_positions
    if misses >= allowed:  # a certain fail: even a perfect rest of the capped sample cannot bring it back
        return Verdict(False, True, low, high, f"fail: {misses} misses, more than a pass over {cap_positions} "
                                               f"positions allows")
    if positions >= cap_positions:
        side = "above" if rate > threshold else "at or below"
        return Verdict(rate > threshold, False, low, high,
                       f"{'pass' if rate > threshold else 'fail'} by the point estimate {rate:.4f} {side} "
                       f"{threshold}: the {CONFIDENCE:.0%} interval [{low:.4f}, {high:.4f}] straddles it at the cap "
                       f"of {cap_positions} positions")
    return None
