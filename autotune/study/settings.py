"""What a study is run with: its settings, its objectives (the metric names the dashboard shows) and its sampler."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import optuna

from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.study.stopping import DEFAULT_PATIENCE

__all__ = ["SearchSettings", "OBJECTIVES", "GOODPUT_OBJECTIVES", "SAMPLERS", "SETUP_TIMEOUT_S", "make_sampler",
           "objectives_for", "study_objectives"]

# The set-up's jobs (reference, speed baselines) and the wait for other workers' trials, where no --trial-timeout
# fixes them: long enough for a big model on a slow machine; a dead worker is found by its heartbeat long before.
SETUP_TIMEOUT_S = 3600.0

# (name, direction): the study's metric names, in the order of its values. A study under latency objectives
# (`--slo`) optimizes the goodput under them instead of the offline figures, beside peak memory.
OBJECTIVES = (("throughput_tok_s", "maximize"), ("tpot_p99_ms", "minimize"), ("peak_memory_mb", "minimize"))
GOODPUT_OBJECTIVES = (("goodput_req_s", "maximize"), ("peak_memory_mb", "minimize"))


def objectives_for(slo: Slo | None) -> tuple[tuple[str, str], ...]:
    return GOODPUT_OBJECTIVES if slo is not None else OBJECTIVES


def study_objectives(study: optuna.Study) -> tuple[tuple[str, str], ...]:
    """The objectives a study was made with (stored on it; a study made before they were stored has OBJECTIVES)."""
    stored = study.user_attrs.get("objectives")
    return tuple((name, direction) for name, direction in stored) if stored else OBJECTIVES
SAMPLERS = ("tpe", "random", "nsga2", "gp")


@dataclass(slots=True)
class SearchSettings:
    model: str
    study: str
    storage: str
    trials: int | None  # None: no count; the time budget and the stop rules (stopping.py) end the search
    workload: Workload = field(default_factory=Workload)
    min_agreement: float = 0.995
    tie_epsilon: float = 0.05
    accept_marginal: bool = False  # marginal gate verdicts count as passes (autotune/gate/verdict.py)
    memory_budget_mb: float | None = None
    tpot_slo_ms: float | None = None
    slo: Slo | None = None  # latency objectives: goodput under them is the study's objective (benchmark/goodput.py)
    sampler: str = "tpe"
    seed: int | None = None
    trial_timeout_s: float | None = None  # None: each trial's limit derives from its predicted cost (trial_limit.py)
    repeats: int = 3
    trial_memory_mb: float | None = None  # each trial's memory limit (backends/isolated.py: how, per device)
    timeout_s: float | None = None  # seconds of trials: no new trial once the next would likely end past them
    # When the trials' time is up (Unix seconds), for every worker of the study: set when the trials begin.
    deadline: float | None = None
    repeat_time_s: float = 60.0  # a trial's timed runs stop before passing this (benchmark/policy.py)
    guided: bool = True  # the simulator orders most trials (autotune/study/guide.py) where the backend has a profile
    sampler_share: int = 3  # with guidance, every this-many-th trial is the sampler's own
    # Stop when none of the last this-many trials is on the front (stopping.py); None: only the budget stops it.
    patience: int | None = DEFAULT_PATIENCE


def make_sampler(name: str, seed: int | None, grouped: bool = False) -> optuna.samplers.BaseSampler:
    """Constraints reach every sampler through Trial.set_constraint (Optuna 5), not through the sampler. `grouped`:
    the space's knobs are conditional on the runtime, whose knobs no other runtime's trial has: TPE then models
    each group of parameters that occur together (`group=True`) instead of falling back to independent sampling."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if name == "tpe":
        # Few trials are affordable on real hardware: start modelling after a handful of random ones.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # group=True is experimental
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5, group=grouped)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=10)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")
