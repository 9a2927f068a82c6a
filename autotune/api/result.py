"""What a search returns: the study it ran (name, storage, trial counts), its Pareto front and best figures, the
recipes written, and the summary and table that `autotune search` prints. Plain values, read from the study once
the trials are done: the result holds no connection to the storage."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.redact import redact
from autotune.results.front import pareto_trials
from autotune.results.tables import pareto_table, study_summary
from autotune.study.settings import OBJECTIVES

__all__ = ["SearchResult", "TrialCounts", "ParetoPoint"]


@dataclass(frozen=True, slots=True)
class TrialCounts:
    """Trials of the whole study (not only this call's), by state. `gated` failed the accuracy gate (Optuna's
    PRUNED); `failed` includes trials that were not run for lack of time and interrupted ones that were retried;
    `repeats` are a sampler's repeats of a measured configuration, told its result without a run (in `complete`
    or `gated` too, but no trial of the budget)."""

    total: int
    complete: int
    gated: int
    failed: int
    running: int
    waiting: int
    repeats: int

    @classmethod
    def of(cls, study: optuna.Study) -> TrialCounts:
        trials = study.get_trials(deepcopy=False)
        states = [t.state for t in trials]
        state = optuna.trial.TrialState
        return cls(total=len(states), complete=states.count(state.COMPLETE), gated=states.count(state.PRUNED),
                   failed=states.count(state.FAIL), running=states.count(state.RUNNING),
                   waiting=states.count(state.WAITING),
                   repeats=sum("duplicate_of" in t.user_attrs for t in trials))


@dataclass(frozen=True, slots=True)
class ParetoPoint:
    """One trial of the front: its configuration and the figures it was measured (or simulated) at."""

    number: int
    label: str
    config: dict[str, Any]
    throughput_tok_s: float
    tpot_p99_ms: float
    peak_memory_mb: float
    goodput_req_s: float | None = None  # a study under latency objectives (`slo`): its objective

    @classmethod
    def of(cls, trial: optuna.trial.FrozenTrial) -> ParetoPoint:
        bench = trial.user_attrs.get("bench") or {}
        figures = {name: float(bench[name]) for name, _ in OBJECTIVES}
        goodput = bench.get("goodput_req_s")
        return cls(number=trial.number, label=str(trial.user_attrs.get("label", "")),
                   config=dict(trial.user_attrs.get("config", {})), **figures,
                   goodput_req_s=float(goodput) if goodput is not None else None)


@dataclass(frozen=True, slots=True)
class SearchResult:
    """The outcome of `autotune.search`. `storage` never holds a password; `front` is sorted by throughput, best
    first, and is empty when no trial was feasible and passed the gate."""

    study: str
    storage: str
    trials: TrialCounts
    front: tuple[ParetoPoint, ...]
    recipes: tuple[Path, ...]
    summary: str  # the study's line that `autotune search` prints
    table: str  # the front against the speed baselines, as `autotune search` prints it

    @classmethod
    def of(cls, study: optuna.Study, storage: str, recipes: list[Path]) -> SearchResult:
        return cls(study=study.study_name, storage=redact(storage), trials=TrialCounts.of(study),
                   front=tuple(ParetoPoint.of(t) for t in pareto_trials(study)), recipes=tuple(recipes),
                   summary=study_summary(study), table=pareto_table(study))

    @property
    def best_throughput(self) -> ParetoPoint | None:
        return max(self.front, key=lambda p: p.throughput_tok_s, default=None)

    @property
    def best_latency(self) -> ParetoPoint | None:
        """The lowest TPOT p99 on the front."""
        return min(self.front, key=lambda p: p.tpot_p99_ms, default=None)

    @property
    def best_goodput(self) -> ParetoPoint | None:
        """The highest goodput on the front of a study under latency objectives; None without them."""
        return max((p for p in self.front if p.goodput_req_s is not None), key=lambda p: p.goodput_req_s,
                   default=None)

    @property
    def smallest_memory(self) -> ParetoPoint | None:
        return min(self.front, key=lambda p: p.peak_memory_mb, default=None)
