"""`autotune search`: the command line of `autotune.search` (the API runs the study); prints the study's summary, its
front and the recipes written."""
from __future__ import annotations

import argparse

from autotune.api.run import search as search_api
from autotune.api.run import search_defaults
from autotune.cli.args import fraction, non_negative, positive, slo_text, token_range
from autotune.cli.live import live_progress
from autotune.study.settings import SAMPLERS

__all__ = ["register", "search"]

# The defaults are the API's (autotune.search): one place, so that the two never differ.
_D = search_defaults()


def register(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("search", help="run (or resume) a study")
    s.add_argument("--model", default=_D["model"],
                   help="registry name (autotune models), local Hugging Face folder, or Hub id (org/name)")
    s.add_argument("--backend", default=_D["backend"])
    s.add_argument("--hardware", default=_D["hardware"],
                   help="hardware profile, for --backend sim (see autotune hardware)")
    s.add_argument("--space", action="append", default=_D["space"],
                   help="search-space YAML; repeat it with one file per runtime to search them on one front (default, "
                        "on the cpu backend: every runtime's default space, as one; search_spaces/llamacpp.yaml for "
                        "--backend llamacpp, openvino.yaml for --backend openvino)")
    s.add_argument("--runtime", dest="runtimes", action="append", default=_D["runtimes"], metavar="RUNTIME",
                   help="on the cpu backend, search this runtime (engine, openvino, llamacpp); repeat it for several "
                        "(default: every runtime this machine can run, on one front)")
    s.add_argument("--trials", type=positive(int), default=_D["trials"],
                   help="at most this many new trials (default: no count; --timeout's budget ends the search)")
    s.add_argument("--patience", type=positive(int), default=_D["patience"],
                   help=f"stop once none of the last this-many trials reached the Pareto front (default "
                        f"{_D['patience']}); the search also stops when every configuration of the space is measured")
    s.add_argument("--study", default=_D["study"], help="study name (default: <model>-<backend>)")
    s.add_argument("--storage", default=_D["storage"], help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    s.add_argument("--min-agreement", type=fraction, default=_D["min_agreement"], help="gate on tie-aware agreement")
    s.add_argument("--tie-epsilon", type=fraction, default=_D["tie_epsilon"])
    s.add_argument("--accept-marginal", action="store_true", default=_D["accept_marginal"],
                   help="count a build the decode check leaves undecided at its cap (marginal: too close to the "
                        "threshold to tell) as a pass; the table and the recipe mark it")
    s.add_argument("--memory-budget", dest="memory_budget_mb", metavar="MEMORY_BUDGET",
                   type=positive(float), default=_D["memory_budget_mb"], help="MB of peak memory")
    s.add_argument("--tpot-slo", dest="tpot_slo_ms", metavar="TPOT_SLO",
                   type=positive(float), default=_D["tpot_slo_ms"], help="ms, on TPOT p99")
    s.add_argument("--slo", type=slo_text, default=_D["slo"], metavar="ttft=1s,tpot=100ms",
                   help="latency objectives: the study maximizes goodput, the highest Poisson request rate at which "
                        "--attainment of the requests meet both (measured per trial on the serving path), beside "
                        "peak memory (default: none; the offline throughput, TPOT p99 and memory)")
    s.add_argument("--attainment", type=fraction, default=_D["attainment"],
                   help=f"with --slo, the share of requests that must meet it (default {_D['attainment']:g})")
    s.add_argument("--sampler", choices=SAMPLERS, default=_D["sampler"])
    s.add_argument("--no-guide", dest="guided", action="store_false", default=_D["guided"],
                   help="let the sampler alone order the trials (default: the simulator's predictions, refitted to "
                        "the trials measured so far, order most of them on backends it models)")
    s.add_argument("--seed", type=int, default=_D["seed"])
    s.add_argument("--out", default=_D["out"], help="where recipes are written")
    s.add_argument("--no-warm-start", dest="warm_start", action="store_false", default=_D["warm_start"],
                   help="do not try the recipes already under --out for this model and hardware first")
    s.add_argument("--requests", type=positive(int), default=_D["requests"], help="requests per benchmark run")
    s.add_argument("--prompt-tokens", type=token_range, default=_D["prompt_tokens"], help="MIN:MAX prompt tokens")
    s.add_argument("--output-tokens", type=positive(int), default=_D["output_tokens"])
    s.add_argument("--repeats", type=positive(int), default=_D["repeats"],
                   help="at most this many timed runs of the workload per trial, after its warm-up; fewer once two "
                        f"agree within 5%% or --repeat-time is reached (default {_D['repeats']})")
    s.add_argument("--repeat-time", dest="repeat_time_s", metavar="REPEAT_TIME",
                   type=positive(float), default=_D["repeat_time_s"],
                   help="seconds: no timed run of a trial starts that would take its timed runs past this "
                        f"(default {_D['repeat_time_s']:g})")
    s.add_argument("--trial-timeout", dest="trial_timeout_s", metavar="TRIAL_TIMEOUT",
                   type=positive(float), default=_D["trial_timeout_s"],
                   help="seconds per trial (default: derived per trial from its predicted cost on this machine, "
                        "2.5x the prediction, at least 300 s, recorded with the reason)")
    s.add_argument("--timeout", dest="minutes", metavar="TIMEOUT",
                   type=non_negative, default=_D["minutes"],
                   help=f"minutes of trials, counted from the first trial: the set-up before it (converting the "
                        "model once, the capability probe, the reference and the two speed baselines once per study) "
                        "is not counted, and is printed; no trial starts that would likely end later; every worker "
                        f"of the study keeps to it (default {_D['minutes']:g}; 0: no limit)")
    s.add_argument("--trial-memory-mb", type=positive(float), default=_D["trial_memory_mb"],
                   help="memory limit of each trial, in MB: its process's address space on the CPU, its "
                        "processes' resident host memory on cuda and npu (default: none)")
    s.add_argument("--isolate", action="store_true", default=_D["isolate"],
                   help="run each trial of an in-process backend (sim) in its own process (cpu always does)")
    s.add_argument("--workers", type=positive(int), default=_D["workers"],
                   help=f"local worker processes (default {_D['workers']})")
    s.add_argument("--storage-password-file", default=_D["storage_password_file"],
                   help="file whose first line is the storage password (else $AUTOTUNE_STORAGE_PASSWORD)")
    s.set_defaults(func=_run, interruptible=True)


def _run(args: argparse.Namespace) -> int:
    with live_progress():  # a live status on a terminal; plain lines otherwise
        return search(args)


def search(args: argparse.Namespace) -> int:
    """Call the API with the parsed options; print the study's summary, its front and the recipes written."""
    result = search_api(**{name: getattr(args, name) for name in _D})
    print(result.summary)
    print(result.table)
    for path in result.recipes:
        print(f"recipe: {path}")
    return 0
