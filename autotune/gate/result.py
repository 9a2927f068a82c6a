"""A gate's figures and verdict, as they cross process boundaries and land in a study, a recipe and quant-report
(no torch here: the study's process reads them)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from autotune.gate.design import GATE_VERSION

__all__ = ["GateResult", "verdict_word"]


def verdict_word(gate: dict) -> str:
    """A stored gate's verdict in a word or two, as the table, the recipe's notes and `verify` show it."""
    if gate.get("accepted_marginal"):
        return "marginal (accepted)"
    if gate.get("passed"):
        return "pass"
    return "marginal" if gate.get("marginal") else "FAIL"


@dataclass(slots=True)
class GateResult:
    """`tie_aware_agreement` is teacher-forced over the evaluation windows (prefill); `decode_agreement` is the
    same measure through the configuration's own decode path, at its batch size and page size, teacher-forced
    along the reference's greedy continuation of the decode prompts. Both must exceed `min_agreement`, and a gate
    without a decode result never passes. Each agreement comes with its 95% interval; the decode check's verdict
    is the sequential test's (autotune/gate/verdict.py), and a build it leaves undecided at the cap is marginal
    (`decode_decided` False, `decode_passed` False), which `decode_verdict` says. `stopped_early`: the windows
    already held more misses than a pass allows, so the rest was not run. `version`: the gate that measured these
    (autotune/gate/design.py)."""

    tie_aware_agreement: float
    raw_agreement: float
    perplexity: float
    reference_perplexity: float
    kl_divergence: float
    positions: int
    tie_epsilon: float
    min_agreement: float
    tie_aware_interval: list[float] | None = None
    decode_agreement: float | None = None
    decode_raw_agreement: float | None = None
    decode_positions: int = 0
    decode_prompts: int = 0
    decode_interval: list[float] | None = None
    decode_passed: bool | None = None
    decode_decided: bool | None = None
    decode_verdict: str | None = None
    decode_first_miss: int | None = None  # first continuation token where a decided choice was lost
    decode_design_effect: float | None = None  # how far the prompts' misses cluster (autotune/gate/verdict.py)
    stopped_early: bool = False
    version: str = GATE_VERSION

    @property
    def windows_passed(self) -> bool:
        return not self.stopped_early and self.tie_aware_agreement > self.min_agreement

    @property
    def marginal(self) -> bool:
        """Teacher-forced windows passed, and the decode check undecided at its cap."""
        return self.windows_passed and self.decode_decided is False

    @property
    def passed(self) -> bool:
        return self.windows_passed and self.decode_passed is True

    def fail_reason(self) -> str:
        """Why the gate failed, quoting the figure that failed it."""
        if not self.windows_passed:
            where = (f" after {self.positions} positions (stopped: a pass was out of reach)" if self.stopped_early
                     else "")
            return (f"accuracy gate: tie-aware agreement {self.tie_aware_agreement:.4f} <= {self.min_agreement} "
                    f"(raw {self.raw_agreement:.4f}){where}")
        if self.decode_agreement is None:
            return "accuracy gate: the decode check has no result: a gate without it never passes"
        return (f"accuracy gate: decode check {self.decode_agreement:.4f} over {self.decode_positions} positions "
                f"(raw {self.decode_raw_agreement:.4f}): {self.decode_verdict}; teacher-forced windows passed "
                f"({self.tie_aware_agreement:.4f})")

    def to_dict(self) -> dict:
        return {**asdict(self), "passed": self.passed, "marginal": self.marginal}

    @classmethod
    def from_dict(cls, figures: dict) -> GateResult:
        return cls(**{f.name: figures[f.name] for f in fields(cls) if f.name in figures})
