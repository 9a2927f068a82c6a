"""`autotune search`: set up the study (reference, speed baseline), run the trials, print and export the front."""
from __future__ import annotations

import argparse

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
from autotune.study.loop import run_search
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
    s.add_argument("--repeats", type=positive(int), default=3, help="timed runs per trial (after a warm-up)")
    s.add_argument("--trial-timeout", type=positive(float), default=600.0, help="seconds per trial (default 600)")
    s.add_argument("--timeout", type=non_negative, default=10.0,
                   help="minutes of trials: no new trial once one more would likely end later (default 10, so "
                        "that the default search fits in 15 minutes on 2 cores; 0: no limit)")
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
        trial_memory_mb=args.trial_memory_mb, guided=args.guided,
    )
    study = open_study(settings)
    log(f"study {study_name} in {redact(settings.storage)}: {len(study.trials)} trials so far; "
        f"space {space.source} ({space.grid_size()} configurations)")
    prepare_study(study, settings, backend, spec, space)
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
