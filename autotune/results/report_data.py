"""What the report shows, read from a study: each trial's outcome, the search's cost, the recipes table."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config.deploy import DeployConfig
from autotune.recipes.baselines import study_baselines
from autotune.recipes.recipe import recipe_dir
from autotune.results.front import exportable, front_picks, pareto_trials

__all__ = ["OUTCOMES", "Point", "is_simulated", "points", "recipe_rows", "search_cost"]

# Outcome of a trial, in the order the report lists them.
OUTCOMES = ("front", "dominated", "infeasible", "gated", "failed", "running")


@dataclass(frozen=True, slots=True)
class Point:
    number: int
    outcome: str
    label: str
    quant: str
    bench: dict | None
    gate: dict
    reason: str
    baseline: bool  # the default deployment run as a trial (role=baseline)


def is_simulated(study: optuna.Study) -> bool:
    return study.user_attrs.get("measured") is False or study.user_attrs.get("source") == "simulated"


def _outcome(trial: optuna.trial.FrozenTrial, front: set[int]) -> str:
    if trial.state == TrialState.PRUNED:
        return "gated"
    if trial.state == TrialState.FAIL:
        return "failed"
    if trial.state != TrialState.COMPLETE or "bench" not in trial.user_attrs:
        return "running"
    if trial.number in front:
        return "front"
    if any(v > 0 for v in trial.constraints.values()):  # over the memory budget or the latency SLO
        return "infeasible"
    return "dominated"


def points(study: optuna.Study) -> list[Point]:
    front = {t.number for t in pareto_trials(study)}
    out = []
    for t in study.get_trials(deepcopy=False):
        config = t.user_attrs.get("config", {})
        out.append(Point(number=t.number, outcome=_outcome(t, front), label=t.user_attrs.get("label", str(t.params)),
                         quant=str(config.get("quant", t.params.get("quant", "?"))), bench=t.user_attrs.get("bench"),
                         gate=t.user_attrs.get("gate") or {}, reason=t.user_attrs.get("reason", ""),
                         baseline=t.user_attrs.get("role") == "baseline"))
    return out


def search_cost(study: optuna.Study) -> dict[str, str]:
    """The cost of the search as label -> value, for a small table."""
    trials = study.get_trials(deepcopy=False)
    counts = {s: sum(t.state == s for t in trials) for s in TrialState}
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    busy = sum((t.datetime_complete - t.datetime_start).total_seconds() for t in trials
               if t.datetime_start and t.datetime_complete)
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    builds = sum(float(t.user_attrs.get("build_s", 0.0)) for t in trials)
    return {
        "trials": str(len(trials)),
        "benchmarked (complete)": str(counts[TrialState.COMPLETE]),
        "gate rejections (not benchmarked)": str(counts[TrialState.PRUNED]),
        "failed (error, timeout, out of memory)": str(counts[TrialState.FAIL]),
        "gate cache hits": str(sum(bool(t.user_attrs.get("gate_cached")) for t in trials)),
        "repeated configurations (result reused)": str(sum("duplicate_of" in t.user_attrs for t in trials)),
        "wall time, first start to last finish": f"{wall / 60:.1f} min",
        "time in trials": f"{busy / 60:.1f} min",
        "time building": f"{builds / 60:.1f} min",
    }


def recipe_rows(study: optuna.Study, recipes_out: str | Path) -> list[dict]:
    """One row per Pareto point that write_recipes exports, with its file name and whether that file exists."""
    trials = [t for t in pareto_trials(study) if exportable(t)]
    if not trials or "model" not in study.user_attrs or "hardware" not in study.user_attrs:
        return []
    hardware = study.user_attrs["hardware"]
    folder = recipe_dir(recipes_out, study.user_attrs["model"],
                        hardware["hardware"] if isinstance(hardware, dict) else str(hardware))
    picks = front_picks(trials)
    baselines = study_baselines(study.user_attrs)
    base = baselines[0]["bench"] if baselines else {}
    rows = []
    for t in trials:
        bench, gate = t.user_attrs["bench"], t.user_attrs.get("gate") or {}
        path = folder / f"{DeployConfig.from_dict(t.user_attrs['config']).digest()}.yaml"
        rows.append({
            "trial": t.number, "configuration": t.user_attrs.get("label", ""), "picks": picks[t.number],
            "throughput_tok_s": bench["throughput_tok_s"], "tpot_p99_ms": bench["tpot_p99_ms"],
            "peak_memory_mb": bench["peak_memory_mb"],
            "gain": bench["throughput_tok_s"] / base["throughput_tok_s"] if base.get("throughput_tok_s") else None,
            "agreement": gate.get("tie_aware_agreement"), "recipe": str(path), "exported": path.is_file(),
        })
    return rows
