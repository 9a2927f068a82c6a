"""The Pareto front of a study: which trials are on it, and which of those may become recipes. A leaf: everything
that shows or exports a front reads it here."""
from __future__ import annotations

import optuna

from autotune.recipes.recipe import holdout_of, holdout_verdict

__all__ = ["pareto_trials", "exportable", "front_picks"]

# The named recipes among a front's points, by the benchmark figure each is best on: read from the trial's figures,
# not its objective values, which a study under latency objectives orders otherwise (goodput, memory).
_PICKS = (("best-throughput", "throughput_tok_s", max), ("best-latency", "tpot_p99_ms", min),
          ("smallest-memory", "peak_memory_mb", min), ("best-goodput", "goodput_req_s", max))


def _held_back_failed(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
    """Its held-back check (autotune/results/holdout.py) did not pass it: decided against it, or (unless the search
    ran with --accept-marginal, as the trial gate's marginal verdict) left it undecided at its cap or could not run.
    Undecided is not a pass: a build whose misses cluster in a few prompts ends there, however high its estimate."""
    verdict = holdout_verdict(holdout_of(study, trial))
    accepted = bool((trial.user_attrs.get("measured_under") or {}).get("accept_marginal"))
    return verdict == "FAIL" or (verdict in ("marginal", "not run") and not accepted)


def pareto_trials(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """Feasible, gate-passing, non-dominated trials (Optuna's best_trials honours the constraints), less those that
    failed their held-back check: the front is then taken again over the rest."""
    best = [t for t in study.best_trials if "duplicate_of" not in t.user_attrs]
    if any(_held_back_failed(study, t) for t in best):
        rest = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
                if "duplicate_of" not in t.user_attrs and exportable(t) and not _held_back_failed(study, t)]
        best = [t for t in rest if not any(_dominates(o, t, study.directions) for o in rest)]
    return sorted(best, key=lambda t: -t.values[0])


def _dominates(a: optuna.trial.FrozenTrial, b: optuna.trial.FrozenTrial,
               directions: list[optuna.study.StudyDirection]) -> bool:
    signs = [1 if d == optuna.study.StudyDirection.MINIMIZE else -1 for d in directions]
    pairs = [(s * x, s * y) for s, x, y in zip(signs, a.values, b.values)]
    return all(x <= y for x, y in pairs) and any(x < y for x, y in pairs)


def exportable(trial: optuna.trial.FrozenTrial) -> bool:
    """Belt and braces over best_trials: complete, benchmarked, gate passed, every constraint met."""
    gate = trial.user_attrs.get("gate")
    return (trial.state == optuna.trial.TrialState.COMPLETE and "bench" in trial.user_attrs
            and (gate is None or bool(gate.get("passed")) or gate.get("measured") is False)
            and all(v <= 0 for v in trial.constraints.values()))


def front_picks(trials: list[optuna.trial.FrozenTrial]) -> dict[int, list[str]]:
    """Each trial's names among the picks (a pick of a figure no trial has, goodput outside an SLO study, is left
    out)."""
    picks: dict[int, list[str]] = {t.number: [] for t in trials}
    for name, metric, choose in _PICKS:
        having = [t for t in trials if (t.user_attrs.get("bench") or {}).get(metric) is not None]
        if having:
            picks[choose(having, key=lambda t: t.user_attrs["bench"][metric]).number].append(name)
    return picks
