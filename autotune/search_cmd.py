"""`autotune search`: set up the study (reference, speed baseline), run the trials, print and export the front."""
from __future__ import annotations

import warnings

import optuna

from autotune.corpus import eval_set_digest
from autotune.errors import UserInputError
from autotune.models import resolve_model
from autotune.progress import log
from autotune.results import pareto_table, study_summary, write_recipes
from autotune.scheduling import budget_target
from autotune.space import DEFAULT_SPACE, load_space
from autotune.storage import default_storage, open_storage, redact, resolve_url
from autotune.study import OBJECTIVES, SearchSettings, make_sampler, run_search
from autotune.trial import Job
from autotune.weights import model_checksum
from autotune.worker import SETTINGS_ATTR, make_backend, run_local_workers, settings_attr
from autotune.warm_start import enqueue_recipes
from autotune.workload import Workload

__all__ = ["search"]

EVAL_POSITIONS = 4096


def _open_study(settings: SearchSettings) -> optuna.Study:
    storage = open_storage(settings.storage)
    study = optuna.create_study(
        study_name=settings.study, storage=storage, load_if_exists=True,
        directions=[d for _, d in OBJECTIVES], sampler=make_sampler(settings.sampler, settings.seed),
    )
    if study.user_attrs.get("model", settings.model) != settings.model:
        raise UserInputError(f"study {settings.study!r} was made for model {study.user_attrs['model']!r}, "
                             f"not {settings.model!r}: pick another --study")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names([name for name, _ in OBJECTIVES])
    return study


def _prepare(study: optuna.Study, settings: SearchSettings, backend, spec, space) -> None:
    """Reference and speed baseline, measured once per study and workload; descriptive attributes."""
    if not backend.measured:  # the simulator: no weights, no reference, gate not measured (autotune/sim_cmd.py)
        from autotune.sim_cmd import prepare_simulated

        return prepare_simulated(study, settings, backend, spec, space)
    log(f"model {spec.name}: locating weights")
    checksum = model_checksum(spec)
    attrs = {
        "model": settings.model, "model_source": spec.source, "model_checksum": checksum,
        "eval_digest": eval_set_digest(EVAL_POSITIONS), "backend": backend.name, "measured": backend.measured,
        "hardware": backend.fingerprint(), "workload": settings.workload.to_dict(), "space": space.source,
        "dropped_dimensions": space.dropped, "min_agreement": settings.min_agreement,
        "tie_epsilon": settings.tie_epsilon, "memory_budget_mb": settings.memory_budget_mb,
        "tpot_slo_ms": settings.tpot_slo_ms, "sampler": settings.sampler,
    }
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    for name, note in space.dropped.items():
        log(f"space: {name} {note}")
    common = dict(model=settings.model, workload=settings.workload.to_dict(), repeats=settings.repeats)
    log("reference: fp32 eager transformers over the evaluation text (cached after the first time)")
    result = backend.run(Job(kind="reference", eval_positions=EVAL_POSITIONS, **common), settings.trial_timeout_s)
    if result.get("status") != "ok":
        raise UserInputError(f"the reference could not be computed: {result.get('reason')}\n"
                             + "\n".join(result.get("log_tail", [])[-5:]))
    baseline = study.user_attrs.get("speed_baseline")
    if baseline is None or baseline.get("workload") != settings.workload.to_dict():
        log("speed baseline: transformers generate, bf16 eager, batch 8")
        result = backend.run(Job(kind="hf_baseline", **common), settings.trial_timeout_s)
        if result.get("status") != "ok":
            raise UserInputError(f"the speed baseline failed: {result.get('reason')}")
        result["workload"] = settings.workload.to_dict()
        study.set_user_attr("speed_baseline", result)
        log(f"  baseline: {result['bench']['throughput_tok_s']:.1f} tok/s")


def search(args) -> int:
    spec = resolve_model(args.model)
    hardware = getattr(args, "hardware", None)
    backend = make_backend(args.backend, hardware, args.isolate, args.trial_memory_mb)
    space = backend.adapt_space(load_space(args.space or DEFAULT_SPACE))
    study_name = args.study or f"{spec.name}-{args.backend}" + (f"-{hardware}" if hardware else "")
    try:
        workload = Workload(num_requests=args.requests, prompt_min=args.prompt_tokens[0],
                            prompt_max=args.prompt_tokens[1], output_tokens=args.output_tokens)
    except ValueError as exc:
        raise UserInputError(str(exc)) from None
    settings = SearchSettings(
        model=args.model, study=study_name, trials=args.trials,
        storage=resolve_url(args.storage or default_storage(study_name), args.storage_password_file),
        workload=workload, min_agreement=args.min_agreement, tie_epsilon=args.tie_epsilon,
        memory_budget_mb=args.memory_budget, tpot_slo_ms=args.tpot_slo, sampler=args.sampler, seed=args.seed,
        trial_timeout_s=args.trial_timeout, timeout_s=args.timeout * 60 or None, repeats=args.repeats,
        trial_memory_mb=args.trial_memory_mb,
    )
    study = _open_study(settings)
    log(f"study {study_name} in {redact(settings.storage)}: {len(study.trials)} trials so far; "
        f"space {space.source} ({space.grid_size()} configurations)")
    _prepare(study, settings, backend, spec, space)
    study.set_user_attr(SETTINGS_ATTR, settings_attr(settings, args.backend, hardware,
                                                     str(args.space or DEFAULT_SPACE), args.isolate))
    target = budget_target(study, args.trials)
    if not any(t.params == space.baseline_params() for t in study.trials):
        study.enqueue_trial(space.baseline_params(), user_attrs={"role": "baseline"}, skip_if_exists=True)
    if args.warm_start and backend.measured:
        enqueue_recipes(study, space, args.out, spec.name, study.user_attrs["hardware"]["hardware"])
    if args.workers > 1:
        run_local_workers(args.workers, study_name, settings.storage)
    else:
        run_search(settings, space, backend, study, space.baseline_params(), target=target)
    print(study_summary(study))
    print(pareto_table(study))
    written = write_recipes(study, args.out, settings.storage)
    for path in written:
        print(f"recipe: {path}")
    return 0
