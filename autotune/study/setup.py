"""Setting a study up before its trials: open (or resume) it, record what it is about, compute the reference and
measure the speed baseline once, and, for the simulator, predict the baseline instead; queue the baseline trial."""
from __future__ import annotations

import warnings
from typing import Any

import optuna

from autotune.backends import Backend
from autotune.backends.sim import GATE_NOT_MEASURED
from autotune.config.deploy import DeployConfig
from autotune.errors import UserInputError
from autotune.gate.corpus import EVAL_POSITIONS, eval_set_digest
from autotune.models.registry import ModelSpec
from autotune.models.weights import model_checksum
from autotune.progress import log
from autotune.sim.hardware import load_profile
from autotune.sim.predict import predict
from autotune.space.search_space import SearchSpace
from autotune.study.baselines import measure_baselines
from autotune.study.guide import PROFILE_OF_BACKEND
from autotune.study.settings import SETUP_TIMEOUT_S, SearchSettings, make_sampler, objectives_for, study_objectives
from autotune.study.storage import open_storage
from autotune.trial.job import Job, JobKind

__all__ = ["open_study", "prepare_study", "enqueue_baseline", "BASELINE_ROLE"]

BASELINE_ROLE = "baseline"  # the `role` attribute of the baseline trial


def open_study(settings: SearchSettings) -> optuna.Study:
    """The study named in `settings`, created or resumed; a study of another model is refused."""
    storage = open_storage(settings.storage)
    objectives = objectives_for(settings.slo)
    slo = settings.slo.to_dict() if settings.slo is not None else None
    try:
        study = optuna.create_study(
            study_name=settings.study, storage=storage, load_if_exists=True,
            directions=[d for _, d in objectives], sampler=make_sampler(settings.sampler, settings.seed),
        )
    except ValueError as exc:  # an existing study of another number of objectives
        raise UserInputError(f"study {settings.study!r} has other objectives than {_objectives_text(slo)}: "
                             f"{exc}; pick another --study") from None
    if study.user_attrs.get("model", settings.model) != settings.model:
        raise UserInputError(f"study {settings.study!r} was made for model {study.user_attrs['model']!r}, "
                             f"not {settings.model!r}: pick another --study")
    if study.get_trials(deepcopy=False) or "objectives" in study.user_attrs:
        stored = [list(o) for o in study_objectives(study)]
        if stored != [list(o) for o in objectives] or study.user_attrs.get("slo") != slo:
            raise UserInputError(f"study {settings.study!r} optimizes {_objectives_text(study.user_attrs.get('slo'))}"
                                 f", not {_objectives_text(slo)}: resume it with the same --slo and --attainment, "
                                 "or pick another --study")
    study.set_user_attr("objectives", [list(o) for o in objectives])
    study.set_user_attr("slo", slo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([name for name, _ in objectives])
    return study


def _objectives_text(slo: dict | None) -> str:
    if slo is None:
        return "offline throughput, TPOT p99 and peak memory (no --slo)"
    return f"goodput under --slo ttft={slo['ttft_ms']:g}ms,tpot={slo['tpot_ms']:g}ms --attainment {slo['attainment']:g}"


def enqueue_baseline(study: optuna.Study, space: SearchSpace) -> bool:
    """Queue the space's plain deployment as a trial (each runtime's, in a space over several) unless the study
    holds it already (run, running or waiting); True when one was queued. Called once per set-up, before warm
    starts and workers: the one place it is queued, so that it is the study's first trial (the first of its
    runtime) and is never queued twice, also on resume."""
    queued = False
    trials = study.get_trials(deepcopy=False)
    for baseline in space.baselines():
        params = space.trial_params(baseline)  # by Optuna's parameter names, as trials hold them
        if any(t.params == params or t.system_attrs.get("fixed_params") == params for t in trials):
            continue
        study.enqueue_trial(params, user_attrs={"role": BASELINE_ROLE}, skip_if_exists=True)
        queued = True
    return queued


def prepare_study(study: optuna.Study, settings: SearchSettings, backend: Backend, spec: ModelSpec,
                  space: SearchSpace) -> None:
    """Reference and speed baseline, measured once per study and workload; descriptive attributes; the baseline
    trial queued unless the study has it."""
    if backend.measured:
        _prepare_measured(study, settings, backend, spec, space)
    else:  # the simulator: no weights, no reference, the gate not measured
        _prepare_simulated(study, settings, backend, spec, space)
    enqueue_baseline(study, space)


def _log_dropped(space: SearchSpace) -> None:
    """What the backend dropped, one line per reason (llama.cpp's six knobs share one)."""
    names_by_note: dict[str, list[str]] = {}
    for name, note in space.dropped.items():
        names_by_note.setdefault(note, []).append(name)
    for note, names in names_by_note.items():
        log(f"space: {', '.join(names)} {note}")


def _prepare_measured(study: optuna.Study, settings: SearchSettings, backend: Backend, spec: ModelSpec,
                      space: SearchSpace) -> None:
    log(f"model {spec.name}: locating weights")
    checksum = model_checksum(spec)
    attrs = {
        "model": settings.model, "model_source": spec.source, "model_checksum": checksum,
        "model_architecture": spec.architecture,
        "eval_digest": eval_set_digest(EVAL_POSITIONS), "backend": backend.name, "measured": backend.measured,
        "hardware": backend.fingerprint(), "workload": settings.workload.to_dict(), "space": space.source,
        "dropped_dimensions": space.dropped, "min_agreement": settings.min_agreement,
        "tie_epsilon": settings.tie_epsilon, "memory_budget_mb": settings.memory_budget_mb,
        "tpot_slo_ms": settings.tpot_slo_ms, "sampler": settings.sampler,
        "ordered_last": space.ordered_last,
    }
    caps = backend.capabilities()
    if caps is not None:
        attrs["capabilities"] = caps.to_dict()
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    _log_dropped(space)
    for label, why in space.ordered_last.items():
        log(f"space: {label} kept, ordered last by the guide: {why}")
    common: dict[str, Any] = dict(model=settings.model, workload=settings.workload.to_dict(), repeats=settings.repeats)
    timeout_s = settings.trial_timeout_s or SETUP_TIMEOUT_S
    log("reference: fp32 eager transformers over the evaluation text (cached after the first time)")
    result = backend.run(Job(kind=JobKind.REFERENCE, eval_positions=EVAL_POSITIONS, **common), timeout_s)
    if not result.ok:
        raise UserInputError(f"the reference could not be computed: {result.reason}\n"
                             + "\n".join((result.log_tail or [])[-5:]))
    measure_baselines(study, backend, spec, space, common, timeout_s, caps.fastest if caps else None)
    if backend.name in PROFILE_OF_BACKEND:
        # The guide's profile measures this machine's peaks the first time: part of the set-up, not of a trial.
        log(f"simulator profile {PROFILE_OF_BACKEND[backend.name]}: peaks of this machine (measured once, cached)")
        load_profile(PROFILE_OF_BACKEND[backend.name])


def _prepare_simulated(study: optuna.Study, settings: SearchSettings, backend: Backend, spec: ModelSpec,
                       space: SearchSpace) -> None:
    """The simulated counterpart of prepare_study: no weights, no reference, no measured baseline. The gate is
    recorded as not measured; the speed baseline is the simulated plain deployment."""
    profile = backend.profile  # type: ignore[attr-defined]  # the simulator's, or its isolated wrapper's
    attrs = {
        "model": settings.model, "model_source": spec.source,
        "model_checksum": f"not computed: simulated ({spec.name})", "model_architecture": spec.architecture,
        "eval_digest": "none: simulated", "backend": backend.name, "measured": False, "source": "simulated",
        "profile": profile.label, "hardware": backend.fingerprint(), "workload": settings.workload.to_dict(),
        "space": space.source, "dropped_dimensions": space.dropped, "gate": GATE_NOT_MEASURED,
        "memory_budget_mb": settings.memory_budget_mb, "tpot_slo_ms": settings.tpot_slo_ms,
        "sampler": settings.sampler,
    }
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    log(f"SIMULATED study on {profile.label} ({profile.calibration_source}): figures are "
        f"predictions, the accuracy gate is not measured")
    _log_dropped(space)
    baseline = DeployConfig(dtype=profile.fastest_precision, quant="none", fusion_level="O0", batch_size=8)
    result = predict(spec, baseline, settings.workload, profile)
    study.set_user_attr("speed_baseline", {
        "status": "ok", "bench": result.bench(), "batch_size": baseline.batch_size, "source": "simulated",
        "what": f"simulated {baseline.dtype} eager (O0) engine", "workload": settings.workload.to_dict()})
