"""`autotune search`: set up the study (reference, speed baseline), run the trials, print and export the front."""
from __future__ import annotations

import argparse
import time

from autotune.backends import make_backend
from autotune.cli.args import fraction, non_negative, positive, token_range
from autotune.cli.live import live_progress
from autotune.config.workload import Workload
from autotune.errors import UserInputError
from autotune.models.registry import resolve_model
from autotune.progress import log
from autotune.recipes.warm_start import enqueue_recipes
from autotune.redact import redact
from autotune.results.export import write_recipes
from autotune.results.tables import pareto_table, study_summary
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.study.coordination import budget_target
from autotune.study.loop import enqueue_baseline, run_search
from autotune.study.settings import SAMPLERS, SearchSettings
from autotune.study.setup import open_study, prepare_study
from autotune.study.storage import default_storage, resolve_url
from autotune.study.workers import SETTINGS_ATTR, run_local_workers, settings_attr

__all__ = ["register", "search"]


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("search", help="run (or resume) a study")
    s.add_argument("--model", default="smollm2-135m",
                   help="registry name (autotune models), local Hugging Face folder, or Hub id (org/name)")
    s.add_argument("--backend", default="cpu")
    s.add_argument("--hardware", default=None, help="hardware profile, for --backend sim (see autotune hardware)")
    s.add_argument("--space", default=None, help="search-space YAML (default: search_spaces/default.yaml)")
    s.add_argument("--trials", type=positive(int), default=8,
                   help="new trials to run (default 8: the default search then fits in 15 minutes on 2 cores)")
    s.add_argument("--study", default=None, help="study name (default: <model>-<backend>)")
    s.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    s.add_argument("--min-agreement", type=fraction, default=0.995, help="gate on tie-aware agreement")
    s.add_argument("--tie-epsilon", type=fraction, default=0.05)
    s.add_argument("--memory-budget", type=positive(float), default=None, help="MB of peak memory")
    s.add_argument("--tpot-slo", type=positive(float), default=None, help="ms, on TPOT p99")
    s.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    s.add_argument("--no-guide", dest="guided", action="store_false",
                   help="let the sampler alone order the trials (default: the simulator's predictions, refitted to "
                        "the trials measured so far, order most of them on backends it models)")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--out", default="recipes", help="where recipes are written")
    s.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                   help="do not try the recipes already under --out for this model and hardware first")
    s.add_argument("--requests", type=positive(int), default=16, help="requests per benchmark run")
    s.add_argument("--prompt-tokens", type=token_range, default=(112, 144), help="MIN:MAX prompt tokens")
    s.add_argument("--output-tokens", type=positive(int), default=64)
    s.add_argument("--repeats", type=positive(int), default=3,
                   help="at most this many timed runs of the workload per trial, after its warm-up; fewer once two "
                        "agree within 5%% or --repeat-time is reached (default 3)")
    s.add_argument("--repeat-time", type=positive(float), default=60.0,
                   help="seconds: no timed run of a trial starts that would take its timed runs past this (default 60)")
    s.add_argument("--trial-timeout", type=positive(float), default=None,
                   help="seconds per trial (default: derived per trial from its predicted cost on this machine, "
                        "2.5x the prediction, at least 300 s, recorded with the reason)")
    s.add_argument("--timeout", type=non_negative, default=10.0,
                   help="minutes of trials, counted from the first trial: the set-up before it (converting the "
                        "model once, the capability probe, the reference and the two speed baselines once per study) "
                        "is not counted, and is printed; no trial starts that would likely end later; every worker "
                        "of the study keeps to it (default 10; 0: no limit)")
    s.add_argument("--trial-memory-mb", type=positive(float), default=None,
                   help="memory limit of each trial, in MB: its process's address space on the CPU, its "
                        "processes' resident host memory on cuda and npu (default: none)")
    s.add_argument("--isolate", action="store_true",
                   help="run each trial of an in-process backend (sim) in its own process (cpu always does)")
    s.add_argument("--workers", type=positive(int), default=1, help="local worker processes (default 1)")
    s.add_argument("--storage-password-file", default=None,
                   help="file whose first line is the storage password (else $AUTOTUNE_STORAGE_PASSWORD)")
    s.set_defaults(func=_run, interruptible=True)


def _run(args: argparse.Namespace) -> int:
    with live_progress():  # a live status on a terminal; plain lines otherwise
        return search(args)


def search(args: argparse.Namespace) -> int:
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
        repeat_time_s=args.repeat_time,
        trial_memory_mb=args.trial_memory_mb, guided=args.guided,
    )
    study = open_study(settings)
    log(f"study {study_name} in {redact(settings.storage)}: {len(study.trials)} trials so far; "
        f"space {space.source} ({space.grid_size()} configurations)")
    setup_started = time.perf_counter()
    prepare_study(study, settings, backend, spec, space)
    log(f"set-up took {time.perf_counter() - setup_started:.0f} s (not counted in the trials' "
        f"{args.timeout:g} minutes)" if args.timeout else f"set-up took {time.perf_counter() - setup_started:.0f} s")
    target = budget_target(study, args.trials)
    enqueue_baseline(study, space)
    if args.warm_start and backend.measured:
        enqueue_recipes(study, space, args.out, spec.name, study.user_attrs["hardware"]["hardware"])
    if settings.timeout_s:
        settings.deadline = time.time() + settings.timeout_s
    study.set_user_attr(SETTINGS_ATTR, settings_attr(settings, args.backend, hardware,
                                                     str(args.space or DEFAULT_SPACE), args.isolate))
    if args.workers > 1:
        run_local_workers(args.workers, study_name, settings.storage)
    else:
        run_search(settings, space, backend, study, target=target)
    print(study_summary(study))
    print(pareto_table(study))
    written = write_recipes(study, args.out, settings.storage)
    for path in written:
        print(f"recipe: {path}")
    return 0
