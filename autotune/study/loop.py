"""The study: Optuna ask/tell over the search space, each trial built, gated and benchmarked by a backend."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import optuna

from autotune.backends import Backend
from autotune.config.deploy import DeployConfig
from autotune.gate.cache import load_gate
from autotune.gate.result import GateResult
from autotune.progress import log, notify
from autotune.space.search_space import SearchSpace
from autotune.study.cache_stats import record_hit_rates
from autotune.study.coordination import (
    budget_target,
    fail_and_retry,
    heartbeat,
    wait_for_slot,
    wait_for_twin,
    worker_id,
)
from autotune.study.doubt import doubted
from autotune.study.guide import Guide
from autotune.study.settings import OBJECTIVES, SearchSettings, study_objectives
from autotune.study.stopping import stop_reason
from autotune.study.storage import heartbeat_seconds
from autotune.study.trial_limit import CEILING_S, GRACE_S, TrialLimit, trial_limit
from autotune.study.turns import (
    GUIDED_SHARE_OF_LEFT,
    MAX_MISSES,
    MAX_REPEATS,
    enqueue_first_builds,
    enqueue_guided,
    enqueued,
    over_budget,
    typical_trial_s,
)
from autotune.trial.gate_key import trial_gate_key
from autotune.trial.job import Job, JobKind, JobResult, Status

__all__ = ["run_search", "best_so_far"]


def _values(bench: dict, objectives) -> list[float]:
    return [bench[name] for name, _ in objectives]


def _constraint_values(settings: SearchSettings, bench: dict) -> dict[str, float]:
    """Feasible when every value is <= 0."""
    out = {}
    if settings.memory_budget_mb:
        out["memory_budget"] = bench["peak_memory_mb"] - settings.memory_budget_mb
    if settings.tpot_slo_ms:
        out["tpot_slo"] = bench["tpot_p99_ms"] - settings.tpot_slo_ms
    if bench.get("doubt"):
        # Other processes disturbed every timed run (autotune/contention.py): the figures are not this
        # configuration's, so it stays off the front, its reason in `bench.doubt`.
        out["quiet_machine"] = 1.0
    return out


def _measured_under(settings: SearchSettings) -> dict:
    """What a trial's result depends on beyond its configuration: the gate's threshold and tie epsilon, and the
    workload its benchmark ran. Stored on each trial, so that a result is reused only under the same."""
    return {"min_agreement": settings.min_agreement, "tie_epsilon": settings.tie_epsilon,
            **({"accept_marginal": True} if settings.accept_marginal else {}), "workload": settings.workload.to_dict(),
            **({"slo": settings.slo.to_dict()} if settings.slo is not None else {})}


def _previous(study: optuna.Study, params: dict, settings: SearchSettings) -> optuna.trial.FrozenTrial | None:
    states = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    under = _measured_under(settings)
    for t in study.get_trials(deepcopy=False, states=states):
        if t.params == params and "duplicate_of" not in t.user_attrs and t.user_attrs.get("measured_under") == under:
            return t
    return None


# "what": the command line that serves a llama.cpp trial's configuration (llama-server's), for its recipe.
_STORED = ("gate", "bench", "versions", "threads", "build_s", "gate_cached", "reason", "log_tail", "source", "profile",
           "compile_cache", "timing", "quant", "what", "build", "goodput")


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
        objectives = study_objectives(study)
        for name, _ in objectives:
            trial.set_user_attr(name, bench[name])
        study.tell(trial, _values(bench, objectives))
        goodput = (f"goodput {bench['goodput_req_s']:.3g} req/s ({bench['goodput_tok_s']:.1f} tok/s), "
                   if "goodput_req_s" in bench else "")
        doubted = f" DOUBTED, kept off the front: {bench['doubt']}" if bench.get("doubt") else ""
        return (f"{goodput}{bench['throughput_tok_s']:.1f} tok/s, TPOT p99 {bench['tpot_p99_ms']:.1f} ms, "
                f"{bench['peak_memory_mb']:.0f} MB{doubted}")
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
    for i, (name, direction) in enumerate(study_objectives(study)):
        pick = (max if direction == "maximize" else min)(feasible, key=lambda t: t.values[i])
        parts.append(f"{name} {pick.values[i]:.1f} (#{pick.number})")
    return "best: " + sep.join(parts)


def _front(study: optuna.Study) -> list[dict]:
    """The feasible Pareto front so far, as the trial's successive halving reads it."""
    if study_objectives(study) != OBJECTIVES:  # the cut compares offline figures: a goodput front has none
        return []
    return [{"number": t.number, **{name: t.values[i] for i, (name, _) in enumerate(OBJECTIVES)}}
            for t in study.best_trials]


def _probe_compile_s(study: optuna.Study) -> float | None:
    """The capability probe's small compile on this machine (probe/compile_time.py), where the study has it."""
    return ((study.user_attrs.get("capabilities") or {}).get("figures") or {}).get("compile_s")


def _left_s(settings: SearchSettings) -> float | None:
    return settings.deadline - time.time() if settings.deadline is not None else None


def _limit(study: optuna.Study, settings: SearchSettings, guide: Guide | None, config: DeployConfig,
           gated: bool = True) -> TrialLimit:
    if guide is not None:
        guide.refit(study.get_trials(deepcopy=False))  # nothing to do unless a trial was measured since
    return trial_limit(guide.spec if guide else None, config, settings.workload, guide.profile if guide else None,
                       study.get_trials(deepcopy=False), repeats=settings.repeats,
                       repeat_time_s=settings.repeat_time_s, fixed_s=settings.trial_timeout_s, gated=gated,
                       probe_compile_s=_probe_compile_s(study), left_s=_left_s(settings))


def _record_cost(study: optuna.Study, trial: optuna.Trial, limit: TrialLimit, seconds: float) -> None:
    """The trial's wall time against what was expected of it, printed and stored on the trial; the study keeps
    the median of the errors so far (`cost_model_error`), which says how far to trust the limits and the budget."""
    trial.set_user_attr("trial_seconds", round(seconds, 1))
    expected = limit.expected_s
    if not expected:
        log(f"  took {seconds:.0f} s (no prediction)")
        return
    error = seconds / expected - 1.0
    trial.set_user_attr("trial_cost", {"expected_s": round(expected, 1), "actual_s": round(seconds, 1),
                                       "error": round(error, 3)})
    log(f"  took {seconds:.0f} s against {expected:.0f} s predicted ({error:+.0%})")
    errors = [t.user_attrs["trial_cost"]["error"] for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get("trial_cost")] + [error]
    study.set_user_attr("cost_model_error", {"trials": len(errors), "median_abs": round(
        statistics.median(abs(e) for e in errors), 3), "median": round(statistics.median(errors), 3)})


def _evaluate(study: optuna.Study, trial: optuna.Trial, settings: SearchSettings, backend: Backend,
              config: DeployConfig, common: dict, guide: Guide | None) -> JobResult:
    """The trial's result: a finished twin's result reused, a cached failing gate, or the backend's run."""
    wait_for_twin(study, trial, 2 * heartbeat_seconds()[1], settings.trial_timeout_s or CEILING_S)
    trial.set_user_attr("measured_under", _measured_under(settings))
    previous = _previous(study, trial.params, settings)
    if previous is not None:
        log(f"  same configuration as trial #{previous.number}: its result is reused, and it is not counted")
        return _reused(trial, previous)
    job = Job(kind=JobKind.TRIAL, config=config.to_dict(), threads=config.device_power, front=_front(study),
              **common)
    # Keyed by the numerics, the verdict's settings, the device and the threads: a cached entry's teacher-forced
    # verdict holds for this trial; its decode figures were of another batch and page size, so only a windows
    # failure ends the trial here, and a pass has the decode check run again in the trial.
    device, versions = backend.gate_identity(config)
    job.gate = load_gate(trial_gate_key(job, checksum=study.user_attrs["model_checksum"], device=device,
                                        versions=versions, eval_digest=study.user_attrs["eval_digest"]))
    cached_gate = job.gate
    if cached_gate is not None and not GateResult.from_dict(cached_gate).windows_passed:
        return JobResult(Status.GATED, gate=cached_gate, gate_cached=True)
    limit = _limit(study, settings, guide, config, gated=cached_gate is None)
    trial.set_user_attr("trial_limit", limit.to_dict())
    log(f"  limit {limit.seconds:.0f} s: {limit.reason}")
    started = time.perf_counter()
    result = backend.run(job, limit.seconds)
    _record_cost(study, trial, limit, time.perf_counter() - started)
    return result


def _reused(trial: optuna.Trial, previous: optuna.trial.FrozenTrial) -> JobResult:
    """A measured configuration's result for its repeat, which is marked `duplicate_of` and so costs no trial of
    the budget (coordination.counted) and is never a second point on the front."""
    trial.set_user_attr("duplicate_of", previous.number)
    status = Status.OK if previous.state == optuna.trial.TrialState.COMPLETE else Status.GATED
    return JobResult(status, gate=previous.user_attrs.get("gate"), bench=previous.user_attrs.get("bench"))


def _cost_model(study: optuna.Study, settings: SearchSettings, guide: Guide | None) -> Callable[[DeployConfig], float]:
    """Expected seconds of a configuration's trial: its prediction, corrected by this study's trials (trial_limit);
    without a profile, the median of this study's trials so far (0 before any)."""
    trials = study.get_trials(deepcopy=False)
    measured = [t.user_attrs["trial_seconds"] for t in trials if t.user_attrs.get("trial_seconds") and not doubted(t)]
    median = statistics.median(measured) if measured else 0.0
    if guide is None:
        return lambda config: median
    guide.refit(trials)

    probe_s = _probe_compile_s(study)

    def cost(config: DeployConfig) -> float:
        limit = trial_limit(guide.spec, config, settings.workload, guide.profile, trials, repeats=settings.repeats,
                            repeat_time_s=settings.repeat_time_s, probe_compile_s=probe_s)
        return limit.expected_s if limit.expected_s is not None else median
    return cost


def _fitting_pick(study: optuna.Study, guide: Guide, done: int, fits: Callable[[DeployConfig], bool] | None) -> bool:
    """Queue the guide's next configuration that `fits` the time left (its own turn, not the sampler's); whether one
    was queued."""
    if fits is None:
        return False
    enqueue_guided(study, guide, done, 0, fits, sampler_turn=False)
    return bool(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,)))


def _stopped(study: optuna.Study, settings: SearchSettings, rule: str, reason: str, ran: int) -> None:
    """Say which rule ended this run of the search and how much of its time budget it used; stored on the study
    (`stopped_by`) so that a report or a later run can tell."""
    used = ""
    record: dict = {"rule": rule, "reason": reason, "trials_here": ran}
    if settings.deadline is not None and settings.timeout_s:
        spent = settings.timeout_s - max(settings.deadline - time.time(), 0.0)
        used = f"; {spent:.0f} s of the {settings.timeout_s:.0f} s budget used ({spent / settings.timeout_s:.0%})"
        record.update(used_s=round(spent, 1), budget_s=settings.timeout_s)
    log(f"search stopped after {ran} trials here: {reason}{used}")
    study.set_user_attr("stopped_by", record)


def run_search(settings: SearchSettings, space: SearchSpace, backend: Backend, study: optuna.Study, *,
               target: int | None = None) -> None:
    """Run trials until the time budget is spent, or the study holds `target` done trials (None: `settings.trials`
    more, or no count where that is None too), or a stop rule says the search is done (stopping.py: the space
    exhausted, the front unmoved for `settings.patience` trials). Any number of workers may run this on one study
    at once: they share the budget and never evaluate a configuration twice; a repeat of a measured configuration
    is told its result and costs no trial. Finished trials already in the study are kept (resume). On Ctrl-C or
    SIGTERM the running trial is failed and enqueued again, and the interrupt goes on up. The baseline trial is
    queued by the set-up (setup.prepare_study), before any worker starts, not here."""
    if target is None:
        target = budget_target(study, settings.trials)
    common = dict(model=settings.model, workload=settings.workload.to_dict(), min_agreement=settings.min_agreement,
                  tie_epsilon=settings.tie_epsilon, accept_marginal=settings.accept_marginal, repeats=settings.repeats,
                  repeat_time_s=settings.repeat_time_s,
                  slo=settings.slo.to_dict() if settings.slo is not None else None)
    patience_s = (settings.trial_timeout_s or CEILING_S) + GRACE_S + 2 * heartbeat_seconds()[1]
    # The guide's profile also predicts each trial's cost (its limit, and whether it fits the time budget); with
    # --no-guide it still does that, without ordering the trials.
    guide = Guide.for_backend(backend.name, settings.model, space, settings.workload, settings.slo)
    guided = settings.guided
    started, ran, skipped, misses, repeats = time.perf_counter(), 0, False, 0, 0
    while True:
        done = wait_for_slot(study, target, patience_s)
        if done is None:
            _stopped(study, settings, "trials", f"the study's budget of {target} trials is spent", ran)
            break
        left = settings.deadline - time.time() if settings.deadline is not None else float("inf")
        if left <= 0:
            _stopped(study, settings, "time", "the time budget is spent; run the same command again to continue", ran)
            break
        why = stop_reason(study, space, settings.patience)
        if why is not None:
            _stopped(study, settings, "rule", why, ran)
            break
        cost = _cost_model(study, settings, guide) if settings.deadline is not None else None
        fits = None
        if cost is not None:
            typical = typical_trial_s(study)

            def fits(c: DeployConfig, cost=cost, left=left, typical=typical) -> bool:
                expected = cost(c)
                return expected <= 0.9 * left and (expected <= GUIDED_SHARE_OF_LEFT * left or expected <= typical)
        if guide is not None and guided:
            first_build = cost is not None and enqueue_first_builds(study, guide, cost, left)
            if not first_build and not enqueue_guided(study, guide, done, settings.sampler_share, fits,
                                                         sampler_turn=not skipped):
                _stopped(study, settings, "time", f"nothing the guide would try is predicted to end in the {left:.0f} "
                         "s left; run the same command again to continue", ran)
                break
        trial = study.ask()
        with heartbeat(study, trial):
            try:
                params = space.suggest(trial)
                config = space.to_config(params)
                skipped = False
                previous = None if enqueued(study, trial) else _previous(study, trial.params, settings)
                if previous is not None:
                    repeats += 1
                    _tell_repeat(study, trial, settings, config, previous)
                    skipped = True  # the next turn is the guide's: its best untried point
                    if repeats >= MAX_REPEATS:
                        _stopped(study, settings, "rule", f"the sampler proposed only measured configurations, "
                                 f"{repeats} times in a row", ran)
                        break
                    continue
                repeats = 0
                if cost is not None and over_budget(study, trial, config, cost(config), left):
                    if enqueued(study, trial):
                        _stopped(study, settings, "time", f"the next queued trial is predicted to end past the "
                                 f"{left:.0f} s left; run the same command again to continue", ran)
                        break
                    skipped = True  # not counted in the budget; the next turn is the guide's
                    misses += 1
                    if misses >= MAX_MISSES:
                        if guide is not None and not guided and _fitting_pick(study, guide, done, fits):
                            # An unguided study (--no-guide) still has the guide's cost model: a configuration it
                            # predicts to fit beats ending with the budget unspent.
                            log(f"  the sampler's last {misses} picks would end past the time left: the guide "
                                "queues one predicted to fit")
                            misses = 0
                            continue
                        _stopped(study, settings, "time", f"the sampler's last {misses} picks would all end past "
                                 "the time left; run the same command again to continue", ran)
                        break
                    continue
                misses = 0
                trial.set_user_attr("config", config.to_dict())
                trial.set_user_attr("label", config.label())
                trial.set_user_attr("worker", worker_id())
                elapsed = time.perf_counter() - started
                eta = f", {elapsed / ran:.1f} s per trial here" if ran else ""
                k = done + 1
                of = f"/{target}" if target is not None else ""
                budget = f", {left:.0f} s of the time budget left" if left != float("inf") else ""
                log(f"trial {k}{of} (#{trial.number}{eta}{budget}): {config.label()}")
                notify("trial", k=k, total=target, number=trial.number, label=config.label(),
                       deadline=settings.deadline)
                result = _evaluate(study, trial, settings, backend, config, common, guide)
                log(f"  -> {_record(study, trial, settings, result)}")
            except BaseException as exc:  # Ctrl-C, SIGTERM (as KeyboardInterrupt), lost storage: retry it later
                fail_and_retry(study, trial, f"interrupted ({type(exc).__name__}): retried on the next run")
                raise
        ran += 1
        record_hit_rates(study)
        log(f"  {best_so_far(study)}")
        notify("told", study=study, number=trial.number)


def _tell_repeat(study: optuna.Study, trial: optuna.Trial, settings: SearchSettings, config: DeployConfig,
                 previous: optuna.trial.FrozenTrial) -> None:
    """The sampler proposed a configuration the study has measured: it is not run and costs no trial. It is told
    the measured result (so that the sampler learns that point as it would from a run), marked as a repeat, and
    counted on the study (`repeats_skipped`)."""
    trial.set_user_attr("config", config.to_dict())
    trial.set_user_attr("label", config.label())
    trial.set_user_attr("measured_under", _measured_under(settings))
    trial.set_user_attr("repeat_of", previous.number)
    log(f"  the sampler proposed {config.label()} again (trial #{previous.number}): not run, not counted; its "
        "result is reused and the guide picks next")
    _record(study, trial, settings, _reused(trial, previous))
    study.set_user_attr("repeats_skipped", int(study.user_attrs.get("repeats_skipped", 0)) + 1)
