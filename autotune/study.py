"""The study: Optuna ask/tell over the search space, each trial built, gated and benchmarked by a backend."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import optuna

from autotune.backends import Backend
from autotune.caches import record_hit_rates
from autotune.config import DeployConfig
from autotune.gatecache import gate_key, load_gate
from autotune.progress import log, notify
from autotune.scheduling import budget_target, fail_and_retry, heartbeat, wait_for_slot, wait_for_twin, worker_id
from autotune.space import SearchSpace
from autotune.storage import heartbeat_seconds
from autotune.trial import Job
from autotune.workload import Workload

__all__ = ["SearchSettings", "OBJECTIVES", "run_search", "make_sampler", "SAMPLERS"]

# (name, direction): the study's metric names, in the order of its values.
OBJECTIVES = (("throughput_tok_s", "maximize"), ("tpot_p99_ms", "minimize"), ("peak_memory_mb", "minimize"))
SAMPLERS = ("tpe", "random", "nsga2", "gp")


@dataclass(slots=True)
class SearchSettings:
    model: str
    study: str
    storage: str
    trials: int
    workload: Workload = field(default_factory=Workload)
    min_agreement: float = 0.995
    tie_epsilon: float = 0.05
    memory_budget_mb: float | None = None
    tpot_slo_ms: float | None = None
    sampler: str = "tpe"
    seed: int | None = None
    trial_timeout_s: float = 900.0
    repeats: int = 3
    trial_memory_mb: float | None = None  # address-space limit of each trial's process
    timeout_s: float | None = None  # no new trial once one more would likely end past this (Optuna's timeout)


def make_sampler(name: str, seed: int | None) -> optuna.samplers.BaseSampler:
    """Constraints reach every sampler through Trial.set_constraint (Optuna 5), not through the sampler."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if name == "tpe":
        # Few trials are affordable on real hardware: start modelling after a handful of random ones.
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=5)
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed, population_size=10)
    if name == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=5)
    raise ValueError(f"unknown sampler {name!r}; choose one of {', '.join(SAMPLERS)}")


def _values(bench: dict) -> list[float]:
    return [bench[name] for name, _ in OBJECTIVES]


def _constraint_values(settings: SearchSettings, bench: dict) -> dict[str, float]:
    """Feasible when every value is <= 0."""
    out = {}
    if settings.memory_budget_mb:
        out["memory_budget"] = bench["peak_memory_mb"] - settings.memory_budget_mb
    if settings.tpot_slo_ms:
        out["tpot_slo"] = bench["tpot_p99_ms"] - settings.tpot_slo_ms
    return out


def _previous(study: optuna.Study, params: dict) -> optuna.trial.FrozenTrial | None:
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    for t in study.get_trials(deepcopy=False, states=states):
        if t.params == params and "duplicate_of" not in t.user_attrs:
            return t
    return None


def _record(study: optuna.Study, trial: optuna.Trial, settings: SearchSettings, result: dict) -> str:
    """Tell the study what happened; returns a one-line summary."""
    for key in ("gate", "bench", "versions", "threads", "build_s", "gate_cached", "reason", "log_tail", "source",
                "profile", "compile_cache"):
        if key in result:
            trial.set_user_attr(key, result[key])
    status = result.get("status")
    if status == "ok":
        bench = result["bench"]
        constraints = _constraint_values(settings, bench)
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        trial.set_user_attr("constraints", constraints)
        for name, _ in OBJECTIVES:
            trial.set_user_attr(name, bench[name])
        study.tell(trial, _values(bench))
        return (f"{bench['throughput_tok_s']:.1f} tok/s, TPOT p99 {bench['tpot_p99_ms']:.1f} ms, "
                f"{bench['peak_memory_mb']:.0f} MB")
    if status == "gated":
        gate = result["gate"]
        reason = (f"accuracy gate: tie-aware agreement {gate['tie_aware_agreement']:.4f} <= "
                  f"{settings.min_agreement} (raw {gate['raw_agreement']:.4f})")
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return f"gated, not benchmarked: {reason}"
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return f"FAILED: {result.get('reason', 'unknown error')}"


def best_so_far(study: optuna.Study, sep: str = ", ") -> str:
    # The best value of each objective among feasible trials is always on the (constrained) Pareto front.
    feasible = study.best_trials
    if not feasible:
        return "no feasible trial yet"
    parts = []
    for i, (name, direction) in enumerate(OBJECTIVES):
        pick = (max if direction == "maximize" else min)(feasible, key=lambda t: t.values[i])
        parts.append(f"{name} {pick.values[i]:.1f} (#{pick.number})")
    return "best: " + sep.join(parts)


def _evaluate(study: optuna.Study, trial: optuna.Trial, settings: SearchSettings, backend: Backend,
              config: DeployConfig, common: dict) -> dict:
    """The trial's result: a finished twin's result reused, a cached failing gate, or the backend's run."""
    wait_for_twin(study, trial, settings.trial_timeout_s + 2 * heartbeat_seconds()[1])
    previous = _previous(study, trial.params)
    if previous is not None:
        trial.set_user_attr("duplicate_of", previous.number)
        log(f"  same configuration as trial #{previous.number}: its result is reused")
        return {"status": "ok" if previous.state == optuna.trial.TrialState.COMPLETE else "gated",
                **{key: previous.user_attrs[key] for key in ("gate", "bench") if key in previous.user_attrs}}
    checksum, digest = study.user_attrs["model_checksum"], study.user_attrs["eval_digest"]
    cached_gate = load_gate(gate_key(checksum, digest, config.numerics_key(), settings.tie_epsilon, backend.name))
    if cached_gate is not None:
        cached_gate = {**cached_gate, "min_agreement": settings.min_agreement,
                       "passed": cached_gate["tie_aware_agreement"] > settings.min_agreement}
    if cached_gate is not None and not cached_gate["passed"]:
        return {"status": "gated", "gate": cached_gate, "gate_cached": True}
    job = Job(kind="trial", config=config.to_dict(), threads=config.device_power, gate=cached_gate,
              memory_limit_mb=settings.trial_memory_mb, **common)
    return backend.run(job, settings.trial_timeout_s)


def run_search(settings: SearchSettings, space: SearchSpace, backend: Backend, study: optuna.Study,
               baseline_params: dict, *, target: int | None = None) -> None:
    """Run trials until the study holds `target` done trials (default: `settings.trials` more, or the rest of an
    interrupted campaign). Any number of workers may run this on one study at once: they share the budget and
    never evaluate a configuration twice. Finished trials already in the study are kept (resume). On Ctrl-C or
    SIGTERM the running trial is failed and enqueued again, and the interrupt goes on up."""
    if not any(t.params == baseline_params for t in study.trials):
        study.enqueue_trial(baseline_params, user_attrs={"role": "baseline"}, skip_if_exists=True)
    if target is None:
        target = budget_target(study, settings.trials)
    common = dict(model=settings.model, workload=settings.workload.to_dict(), min_agreement=settings.min_agreement,
                  tie_epsilon=settings.tie_epsilon, repeats=settings.repeats)
    patience_s = settings.trial_timeout_s + 2 * heartbeat_seconds()[1]
    started, ran = time.perf_counter(), 0
    while (done := wait_for_slot(study, target, patience_s)) is not None:
        elapsed = time.perf_counter() - started
        if settings.timeout_s and ran and elapsed + elapsed / ran > settings.timeout_s:
            log(f"time budget of {settings.timeout_s / 60:.0f} min reached after {ran} trials; "
                "run the same command again to continue")
            break
        trial = study.ask()
        with heartbeat(study, trial):
            try:
                params = space.suggest(trial)
                config = DeployConfig.from_params(params)
                trial.set_user_attr("config", config.to_dict())
                trial.set_user_attr("label", config.label())
                trial.set_user_attr("worker", worker_id())
                elapsed = time.perf_counter() - started
                eta = f", {elapsed / ran:.1f} s per trial here" if ran else ""
                k = done + 1
                log(f"trial {k}/{target} (#{trial.number}{eta}): {config.label()}")
                notify("trial", k=k, total=target, number=trial.number, label=config.label())
                result = _evaluate(study, trial, settings, backend, config, common)
                log(f"  -> {_record(study, trial, settings, result)}")
            except BaseException as exc:  # Ctrl-C, SIGTERM (as KeyboardInterrupt), lost storage: retry it later
                fail_and_retry(study, trial, f"interrupted ({type(exc).__name__}): retried on the next run")
                raise
        ran += 1
        record_hit_rates(study)
        log(f"  {best_so_far(study)}")
        notify("told", study=study, number=trial.number)
