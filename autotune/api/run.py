"""`autotune.search`: run (or resume) a study from Python, as `autotune search` does from the shell. The defaults
of every option are this function's, and the CLI reads them from here (`search_defaults`)."""
from __future__ import annotations

import inspect
import time
from pathlib import Path
from typing import Any

from autotune.api.options import SearchOptions
from autotune.api.result import SearchResult
from autotune.backends import make_backend
from autotune.config.slo import Slo
from autotune.models.registry import resolve_model
from autotune.progress import log
from autotune.recipes.warm_start import enqueue_recipes
from autotune.redact import redact
from autotune.results.export import write_recipes
from autotune.results.holdout import recheck_front
from autotune.study.coordination import budget_target
from autotune.study.loop import run_search
from autotune.study.settings import SearchSettings, make_sampler
from autotune.study.setup import open_study, prepare_study
from autotune.study.stopping import DEFAULT_PATIENCE
from autotune.study.storage import default_storage, resolve_url
from autotune.study.workers import SETTINGS_ATTR, run_local_workers, search_space, settings_attr

__all__ = ["search", "search_defaults"]


def search(
    model: str = "smollm2-135m",
    *,
    backend: str = "cpu",
    hardware: str | None = None,
    space: str | Path | list[str | Path] | None = None,
    runtimes: tuple[str, ...] | list[str] | None = None,
    trials: int | None = None,
    minutes: float | None = 10.0,
    patience: int | None = DEFAULT_PATIENCE,
    study: str | None = None,
    storage: str | None = None,
    storage_password_file: str | Path | None = None,
    min_agreement: float = 0.995,
    tie_epsilon: float = 0.05,
    accept_marginal: bool = False,
    memory_budget_mb: float | None = None,
    tpot_slo_ms: float | None = None,
    slo: str | None = None,
    attainment: float = 0.9,
    sampler: str = "tpe",
    guided: bool = True,
    seed: int | None = None,
    out: str | Path = "recipes",
    warm_start: bool = True,
    requests: int = 16,
    prompt_tokens: int | tuple[int, int] = (112, 144),
    output_tokens: int = 64,
    repeats: int = 3,
    repeat_time_s: float = 60.0,
    trial_timeout_s: float | None = None,
    trial_memory_mb: float | None = None,
    isolate: bool = False,
    workers: int = 1,
) -> SearchResult:
    """Search the deployment configurations of `model` on `backend` and export the Pareto front as recipes.

    The budget is `minutes` of trials (counted from the first trial, the set-up excluded; 0 or None: no limit),
    and `trials` new trials where given (None: no count; finished trials of a resumed study are kept and not
    counted). The search stops earlier only when the space is exhausted or none of the last `patience` trials
    reached the front (None: never for that), and says which rule stopped it. The study is
    `study` (default `<model>-<backend>[-<hardware>]`) in `storage` (an SQLAlchemy URL, default
    `sqlite:///studies/<study>.db`); calling again with the same ones resumes it. Recipes go under `out`.
    `hardware` names a simulator profile (backend "sim"). On the cpu backend the search spans `runtimes` (None:
    every runtime this machine can run: autotune's engine, OpenVINO, llama.cpp where installed) on one front, each
    from its default space; `space` gives a space file instead (or a list of them, one per runtime, as one).
    `slo` ("ttft=1s,tpot=100ms") makes the study's objectives the goodput under those latency objectives at
    `attainment` (the share of requests that must meet both) and peak memory. The other options are those of
    `autotune search` (see `autotune search --help`). Bad values raise UserInputError before anything is run.
    """
    if isinstance(runtimes, list):
        runtimes = tuple(runtimes)
    if isinstance(space, list):
        space = tuple(str(f) for f in space) if len(space) > 1 else (space[0] if space else None)
    return run(SearchOptions(**{name: value for name, value in locals().items() if name in _PARAMETERS}))


_PARAMETERS = tuple(inspect.signature(search).parameters)


def search_defaults() -> dict[str, Any]:
    """Each option's default, by keyword: the one place they are set."""
    return {name: p.default for name, p in inspect.signature(search).parameters.items()}


def _resumed_space(study, options: SearchOptions) -> tuple[str | None, tuple[str, ...] | None]:
    """The space file and runtimes of this search: those given, or, resuming a study that names neither, those it
    ran with (a study of the cpu backend from before searches spanned runtimes ran the engine's default file)."""
    saved = study.user_attrs.get(SETTINGS_ATTR) or {}
    if options.space is not None or options.runtimes is not None or not saved:
        given = options.space if isinstance(options.space, tuple) else str(options.space) if options.space else None
        return given, options.runtimes
    if saved.get("space") and not saved.get("runtimes"):
        log(f"resuming a study of one space: {saved['space']}")
    space = saved.get("space")
    return (tuple(space) if isinstance(space, list) else space), (tuple(saved["runtimes"]) if saved.get("runtimes")
                                                                   else None)


def run(options: SearchOptions) -> SearchResult:
    """Set the study up (reference, speed baselines and the baseline trial, once per study), queue the warm
    starts, run the trials here or in local workers, and write the front's recipes."""
    spec = resolve_model(options.model)
    backend = make_backend(options.backend, options.hardware, options.isolate, options.trial_memory_mb)
    hardware = options.hardware
    study_name = options.study or f"{spec.name}-{options.backend}" + (f"-{hardware}" if hardware else "")
    password_file = str(options.storage_password_file) if options.storage_password_file else None
    url = options.storage or default_storage(study_name)
    settings = SearchSettings(
        model=options.model, study=study_name, trials=options.trials, storage=resolve_url(url, password_file),
        workload=options.workload(), min_agreement=options.min_agreement, tie_epsilon=options.tie_epsilon,
        accept_marginal=options.accept_marginal,
        memory_budget_mb=options.memory_budget_mb, tpot_slo_ms=options.tpot_slo_ms, slo=options.slo_spec(),
        sampler=options.sampler,
        seed=options.seed, trial_timeout_s=options.trial_timeout_s, timeout_s=options.time_limit_s,
        repeats=options.repeats, repeat_time_s=options.repeat_time_s, trial_memory_mb=options.trial_memory_mb,
        guided=options.guided, patience=options.patience,
    )
    if options.space is not None:  # a bad space file is refused before a study is made for it
        search_space(backend, options.space if isinstance(options.space, tuple) else str(options.space),
                     options.runtimes)
    study = open_study(settings)
    space_file, runtimes = _resumed_space(study, options)
    space = search_space(backend, space_file, runtimes, serving=settings.slo is not None)
    if space.parts:
        study.sampler = make_sampler(settings.sampler, settings.seed, grouped=True)
    log(f"study {study_name} in {redact(settings.storage)}: {len(study.trials)} trials so far; "
        f"space {space.source} ({space.grid_size()} configurations)")
    setup_started = time.perf_counter()
    prepare_study(study, settings, backend, spec, space)
    took = f"set-up took {time.perf_counter() - setup_started:.0f} s"
    log(f"{took} (not counted in the trials' {options.minutes:g} minutes)" if options.minutes else took)
    target = budget_target(study, options.trials)
    if options.warm_start and backend.measured:
        enqueue_recipes(study, space, options.out, spec.name, study.user_attrs["hardware"]["hardware"])
    if settings.timeout_s:
        settings.deadline = time.time() + settings.timeout_s
    study.set_user_attr(SETTINGS_ATTR, settings_attr(settings, options.backend, hardware, space_file,
                                                     options.isolate, space.runtimes if space.parts else None))
    if options.workers > 1:
        run_local_workers(options.workers, study_name, settings.storage)
    else:
        run_search(settings, space, backend, study, target=target)
    recheck_front(study, backend, dict(model=settings.model, workload=settings.workload.to_dict(),
                                       min_agreement=settings.min_agreement, tie_epsilon=settings.tie_epsilon))
    if settings.slo is not None:
        _say_if_unmet(study, settings.slo)
    written = write_recipes(study, options.out, settings.storage)
    return SearchResult.of(study, url, written)


def _say_if_unmet(study, slo: Slo) -> None:
    """One line where no configuration met the SLO at any rate tried, with the best attainment seen."""
    measured = [t for t in study.get_trials(deepcopy=False) if (t.user_attrs.get("goodput") or {}).get("rates")]
    if not measured or any(t.user_attrs["goodput"]["met"] for t in measured):
        return
    best = max(((r["attainment"], r["rate"], t.number) for t in measured for r in t.user_attrs["goodput"]["rates"]))
    log(f"no configuration met the SLO ({slo.label()}) at any rate tried: the best attainment seen was "
        f"{best[0]:.0%}, trial #{best[2]} at {best[1]:.3g} req/s")
