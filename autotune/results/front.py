"""The Pareto front of a study: which trials are on it, and which of those may become recipes. A leaf: everything
that shows or exports a front reads it here."""
from __future__ import annotations

import optuna

__all__ = ["pareto_trials", "exportable"]


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible, gate-passing, non-dominated trials (Optuna's best_trials honours the constraints)."""
    best = [t for t in study.best_trials if "duplicate_of" not in t.user_attrs]
    return sorted(best, key=lambda t: -t.values[0])


def exportable(trial: optuna.trial.FrozenTrial) -> bool:
    """Belt and braces over best_trials: complete, benchmarked, gate passed, every constraint met."""
    gate = trial.user_attrs.get("gate")
    return (trial.state == optuna.trial.TrialState.COMPLETE and "bench" in trial.user_attrs
            and (gate is None or bool(gate.get("passed")) or gate.get("measured") is False)
            and all(v <= 0 for v in trial.constraints.values()))
