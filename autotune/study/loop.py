"""The study: Optuna ask/tell over the search space, each trial built, gated and benchmarked by a backend."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import optuna

from autotune.backends import Backend
from autotune.config.deploy import DeployConfig
from autotune.gate.cache import gate_inputs, gate_key, load_gate
from autotune.gate.result import GateResult
from autotune.progress import log, notify
from autotune.space.search_space import SearchSpace
from autotune.study.cache_stats import record_hit_rates
from autotune.study.coordination import (
    NOT_RUN_ATTR,
    budget_target,
    fail_and_retry,
    heartbeat,
    wait_for_slot,
    wait_for_twin,
    worker_id,
)
from autotune.study.guide import GUIDE_ROLE, Guide
from autotune.study.optuna_private import frozen_trial
from autotune.study.settings import OBJECTIVES, SETUP_TIMEOUT_S, SearchSettings
from autotune.study.storage import heartbeat_seconds
from autotune.study.trial_limit import TrialLimit, trial_limit
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["run_search", "best_so_far"]


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


def _measured_under(settings: SearchSettings) -> dict:
    """What a trial's result depends on beyond its configuration: the gate's threshold and tie epsilon, and the
    workload its benchmark ran. Stored on each trial, so that a result is reused only under the same."""
    return {"min_agreement": settings.min_agreement, "tie_epsilon": settings.tie_epsilon,
            "workload": settings.workload.to_dict()}


def _previous(study: optuna.Study, params: dict, settings: SearchSettings) -> optuna.trial.FrozenTrial | None:
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    under = _measured_under(settings)
    for t in study.get_trials(deepcopy=False, states=states):
        if t.params == params and "duplicate_of" not in t.user_attrs and t.user_attrs.get("measured_under") == under:
            return t
    return None


# "what": the command line that serves a llama.cpp trial's configuration (llama-server's), for its recipe.
_STORED = ("gate", "bench", "versions", "threads", "build_s", "gate_cached", "reason", "log_tail", "source", "profile",
           "compile_cache", "timing", "quant", "what")


def _store_calibration(study: optuna.Study, quant: dict | None) -> None:
    """What a calibrated trial was built from, stored once in the study: the calibration set's provenance
    (`calibration`) and each sensitivity ranking (`sensitivity:<scheme>:<method>`), measured once per model, scheme
    and method, that the trials' kept layers were chosen by. Each trial keeps its own kept layers."""
    if not quant:
        return
    attrs = study.user_attrs
    calib = quant.get("calibration")
    # The whole set drawn by a calibrated method, or the subset round-to-nearest's sensitivity drew: kept apart.
    key = "calibration:sensitivity" if calib and calib.get("used_for") == "sensitivity" else "calibration"
    if calib and key not in attrs:
        study.set_user_attr(key, calib)
    sensitivity = quant.get("sensitivity")
    if sensitivity:
        key = f"sensitivity:{sensitivity['scheme']}:{sensitivity['method']}"
        if key not in attrs:
            study.set_user_attr(key, sensitivity)


def _record(study: optuna.Study, trial: optuna.Trial, settings: SearchSettings, result: JobResult) -> str:
    """Tell the study what happened; returns a one-line summary."""
    for key, value in result.to_dict().items():
        if key in _STORED:
            trial.set_user_attr(key, value)
    _store_calibration(study, result.quant)
    if result.status is Status.OK:
        bench = result.bench
        assert bench is not None, "an OK trial result carries its benchmark"
        constraints = _constraint_values(settings, bench)
        for key, value in constraints.items():
            trial.set_constraint(key, value)
        trial.set_user_attr("constraints", constraints)
        for name, _ in OBJECTIVES:
            trial.set_user_attr(name, bench[name])
        study.tell(trial, _values(bench))
        return (f"{bench['throughput_tok_s']:.1f} tok/s, TPOT p99 {bench['tpot_p99_ms']:.1f} ms, "
                f"{bench['peak_memory_mb']:.0f} MB")
    if result.status is Status.GATED:
        gate = result.gate
        assert gate is not None, "a gated trial result carries its gate figures"
        reason = GateResult.from_dict(gate).fail_reason()
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return f"gated, not benchmarked: {reason}"
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return f"FAILED: {result.reason or 'unknown error'}"


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


def _front(study: optuna.Study) -> list[dict]:
    """The feasible Pareto front so far, as the trial's successive halving reads it."""
    return [{"number": t.number, **{name: t.values[i] for i, (name, _) in enumerate(OBJECTIVES)}}
            for t in study.best_trials]


def _limit(study: optuna.Study, settings: SearchSettings, guide: Guide | None, config: DeployConfig,
           gated: bool = True) -> TrialLimit:
    if guide is not None:
        guide.refit(study.get_trials(deepcopy=False))  # nothing to do unless a trial was measured since
    return trial_limit(guide.spec if guide else None, config, settings.workload, guide.profile if guide else None,
                       study.get_trials(deepcopy=False), repeats=settings.repeats,
                       repeat_time_s=settings.repeat_time_s, fixed_s=settings.trial_timeout_s, gated=gated)


def _evaluate(study: optuna.Study, trial: optuna.Trial, settings: SearchSettings, backend: Backend,
              config: DeployConfig, common: dict, guide: Guide | None) -> JobResult:
    """The trial's result: a finished twin's result reused, a cached failing gate, or the backend's run."""
    wait_for_twin(study, trial, (settings.trial_timeout_s or SETUP_TIMEOUT_S) + 2 * heartbeat_seconds()[1])
    trial.set_user_attr("measured_under", _measured_under(settings))
    previous = _previous(study, trial.params, settings)
    if previous is not None:
        trial.set_user_attr("duplicate_of", previous.number)
        log(f"  same configuration as trial #{previous.number}: its result is reused")
        status = Status.OK if previous.state == optuna.trial.TrialState.COMPLETE else Status.GATED
        return JobResult(status, gate=previous.user_attrs.get("gate"), bench=previous.user_attrs.get("bench"))
    checksum, digest = study.user_attrs["model_checksum"], study.user_attrs["eval_digest"]
    # Keyed by the numerics, the verdict's settings, the device and the threads: a cached entry's teacher-forced
    # verdict holds for this trial; its decode figures were of another batch and page size, so only a windows
    # failure ends the trial here, and a pass has the decode check run again in the trial.
    cached_gate = load_gate(gate_key(gate_inputs(checksum, digest, config, tie_epsilon=settings.tie_epsilon,
                                                 min_agreement=settings.min_agreement, device=backend.name,
                                                 threads=config.device_power, versions=backend.gate_versions())))
    if cached_gate is not None and not GateResult.from_dict(cached_gate).windows_passed:
        return JobResult(Status.GATED, gate=cached_gate, gate_cached=True)
    job = Job(kind=JobKind.TRIAL, config=config.to_dict(), threads=config.device_power, gate=cached_gate,
              front=_front(study), **common)
    limit = _limit(study, settings, guide, config, gated=cached_gate is None)
    trial.set_user_attr("trial_limit", limit.to_dict())
    log(f"  limit {limit.seconds:.0f} s: {limit.reason}")
    started = time.perf_counter()
    result = backend.run(job, limit.seconds)
    trial.set_user_attr("trial_seconds", round(time.perf_counter() - started, 1))
    return result


def _cost_model(study: optuna.Study, settings: SearchSettings, guide: Guide | None) -> Callable[[DeployConfig], float]:
    """Expected seconds of a configuration's trial: its prediction, corrected by this study's trials (trial_limit);
    without a profile, the median of this study's trials so far (0 before any)."""
    trials = study.get_trials(deepcopy=False)
    measured = [t.user_attrs["trial_seconds"] for t in trials if t.user_attrs.get("trial_seconds")]
    median = statistics.median(measured) if measured else 0.0
    if guide is None:
        return lambda config: median
    guide.refit(trials)

    def cost(config: DeployConfig) -> float:
        limit = trial_limit(guide.spec, config, settings.workload, guide.profile, trials, repeats=settings.repeats,
                            repeat_time_s=settings.repeat_time_s)
        return limit.expected_s if limit.expected_s is not None else median
    return cost


# A guided pick may take at most this share of the time left (or no longer than 1.5 typical trials here), so that
# one long compile cannot end the search; never more than 90% of it.
GUIDED_SHARE_OF_LEFT = 0.5


# Sampler picks in a row that would end past the budget before the search gives the rest up.
MAX_MISSES = 3


def _typical_trial_s(study: optuna.Study) -> float:
    """1.5x the median wall time of this study's trials (0 before any)."""
    walls = [t.user_attrs["trial_seconds"] for t in study.get_trials(deepcopy=False)
             if t.user_attrs.get("trial_seconds")]
    return 1.5 * statistics.median(walls) if walls else 0.0


def _enqueued(study: optuna.Study, trial: optuna.Trial) -> bool:
    """Whether the trial came from the queue (baseline, warm start, guide, retry) rather than from the sampler."""
    return "fixed_params" in frozen_trial(study, trial).system_attrs


def _over_budget(study: optuna.Study, trial: optuna.Trial, config: DeployConfig, cost: float, left: float) -> bool:
    """A trial that would likely end past the budget is not run: an enqueued one (the baseline, a warm start, the
    guide's pick) is failed and queued again for the next run, which ends this one; a sampler's pick is recorded as
    not run, with the reason, and the search goes on to the next."""
    if cost <= left:
        return False
    reason = (f"not run: predicted {cost:.0f} s for {config.label()}, {max(left, 0):.0f} s left of the time budget")
    log(f"  {reason}")
    if _enqueued(study, trial):
        fail_and_retry(study, trial, f"{reason}; queued again for the next run")
    else:
        trial.set_user_attr("reason", reason)
        trial.set_user_attr(NOT_RUN_ATTR, True)  # not counted in the trial budget (coordination.tally)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
    return True


def _enqueue_guided(study: optuna.Study, guide: Guide, done: int, sampler_share: int,
                    fits: Callable[[DeployConfig], bool] | None, sampler_turn: bool = True) -> bool:
    """Unless a trial waits already (the baseline, warm starts, retries) or it is the sampler's turn, queue the
    guide's next configuration that `fits` the time left, with what it predicts for it. False when it was the
    guide's turn and nothing it would propose fits."""
    if study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)):
        return True
    if sampler_turn and sampler_share and done % sampler_share == sampler_share - 1:
        log("  this trial is the sampler's (TPE) own")
        return True
    started = time.perf_counter()
    guided = sum(t.user_attrs.get("role") == GUIDE_ROLE for t in study.get_trials(deepcopy=False))
    picked = guide.next_params(study, turn=guided, fits=fits)
    if picked is None:
        return fits is None or guide.next_params(study, turn=guided) is None
    params, predicted = picked
    study.enqueue_trial(guide.space.trial_params(params), user_attrs={"role": GUIDE_ROLE, "predicted": predicted})
    log(f"  guide ({guide.fitted_on} trials fitted, {time.perf_counter() - started:.1f} s): predicted "
        f"{predicted['throughput_tok_s']:.1f} tok/s, TPOT p99 {predicted['tpot_p99_ms']:.1f} ms, "
        f"{predicted['peak_memory_mb']:.0f} MB")
    return True


def run_search(settings: SearchSettings, space: SearchSpace, backend: Backend, study: optuna.Study, *,
               target: int | None = None) -> None:
    """Run trials until the study holds `target` done trials (default: `settings.trials` more, or the rest of an
    interrupted campaign). Any number of workers may run this on one study at once: they share the budget and
    never evaluate a configuration twice. Finished trials already in the study are kept (resume). On Ctrl-C or
    SIGTERM the running trial is failed and enqueued again, and the interrupt goes on up. The baseline trial is
    queued by the set-up (setup.prepare_study), before any worker starts, not here."""
    if target is None:
        target = budget_target(study, settings.trials)
    common = dict(model=settings.model, workload=settings.workload.to_dict(), min_agreement=settings.min_agreement,
                  tie_epsilon=settings.tie_epsilon, repeats=settings.repeats, repeat_time_s=settings.repeat_time_s)
    patience_s = (settings.trial_timeout_s or SETUP_TIMEOUT_S) + 2 * heartbeat_seconds()[1]
    # The guide's profile also predicts each trial's cost (its limit, and whether it fits the time budget); with
    # --no-guide it still does that, without ordering the trials.
    guide = Guide.for_backend(backend.name, settings.model, space, settings.workload)
    started, ran, skipped, misses = time.perf_counter(), 0, False, 0
    while (done := wait_for_slot(study, target, patience_s)) is not None:
        left = settings.deadline - time.time() if settings.deadline is not None else float("inf")
        if left <= 0:
            log(f"time budget reached after {ran} trials; run the same command again to continue")
            break
        cost = _cost_model(study, settings, guide) if settings.deadline is not None else None
        if guide is not None and settings.guided:
            fits = None
            if cost is not None and ran:
                typical = _typical_trial_s(study)

                def fits(c: DeployConfig, cost=cost, left=left, typical=typical) -> bool:
                    expected = cost(c)
                    return expected <= 0.9 * left and (expected <= GUIDED_SHARE_OF_LEFT * left or expected <= typical)
            if not _enqueue_guided(study, guide, done, settings.sampler_share, fits, sampler_turn=not skipped):
                log(f"time budget reached after {ran} trials: nothing the guide would try is predicted to end in the "
                    f"{left:.0f} s left; run the same command again to continue")
                break
        trial = study.ask()
        with heartbeat(study, trial):
            try:
                params = space.suggest(trial)
                config = space.to_config(params)
                skipped = False
                if cost is not None and ran and _over_budget(study, trial, config, cost(config), left):
                    if _enqueued(study, trial):
                        log(f"time budget reached after {ran} trials; run the same command again to continue")
                        break
                    skipped = True  # not counted in the budget; the next turn is the guide's
                    misses += 1
                    if misses >= MAX_MISSES:
                        log(f"time budget reached after {ran} trials: the sampler's last {misses} picks would all "
                            "end past it; run the same command again to continue")
                        break
                    continue
                misses = 0
                trial.set_user_attr("config", config.to_dict())
                trial.set_user_attr("label", config.label())
                trial.set_user_attr("worker", worker_id())
                elapsed = time.perf_counter() - started
                eta = f", {elapsed / ran:.1f} s per trial here" if ran else ""
                k = done + 1
                log(f"trial {k}/{target} (#{trial.number}{eta}): {config.label()}")
                notify("trial", k=k, total=target, number=trial.number, label=config.label())
                result = _evaluate(study, trial, settings, backend, config, common, guide)
                log(f"  -> {_record(study, trial, settings, result)}")
            except BaseException as exc:  # Ctrl-C, SIGTERM (as KeyboardInterrupt), lost storage: retry it later
                fail_and_retry(study, trial, f"interrupted ({type(exc).__name__}): retried on the next run")
                raise
        ran += 1
        record_hit_rates(study)
        log(f"  {best_so_far(study)}")
        notify("told", study=study, number=trial.number)
