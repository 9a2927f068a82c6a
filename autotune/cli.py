"""The `autotune` command line."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback

from autotune.errors import AutotuneError, UserInputError

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line and exit 2, as for every other bad input
        print(f"autotune: error: {message} (see autotune {self.prog.split()[-1]} --help)", file=sys.stderr)
        sys.exit(2)


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} must be positive")
        return value
    return parse


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} must be between 0 and 1")
    return value


def _range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX token counts") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r} needs 1 <= MIN <= MAX")
    return pair


def _parser() -> argparse.ArgumentParser:
    from autotune.study import SAMPLERS

    parser = _Parser(prog="autotune", description="Search the deployment knobs of a language model.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    s = sub.add_parser("search", help="run (or resume) a study")
    s.add_argument("--model", default="smollm2-135m", help="registry name or local Hugging Face folder")
    s.add_argument("--backend", default="cpu")
    s.add_argument("--hardware", default=None, help="hardware profile, for --backend sim (see autotune hardware)")
    s.add_argument("--space", default=None, help="search-space YAML (default: search_spaces/default.yaml)")
    s.add_argument("--trials", type=_positive(int), default=8,
                   help="new trials to run (default 8: the default search then fits in 15 minutes on 2 cores)")
    s.add_argument("--study", default=None, help="study name (default: <model>-<backend>)")
    s.add_argument("--storage", default=None, help="SQLAlchemy URL (default: sqlite:///studies/<study>.db)")
    s.add_argument("--min-agreement", type=_fraction, default=0.995, help="gate on tie-aware agreement")
    s.add_argument("--tie-epsilon", type=_fraction, default=0.05)
    s.add_argument("--memory-budget", type=_positive(float), default=None, help="MB of peak memory")
    s.add_argument("--tpot-slo", type=_positive(float), default=None, help="ms, on TPOT p99")
    s.add_argument("--sampler", choices=SAMPLERS, default="tpe")
    s.add_argument("--seed", type=int, default=None)
    s.add_argument("--out", default="recipes", help="where recipes are written")
    s.add_argument("--no-warm-start", dest="warm_start", action="store_false",
                   help="do not try the recipes already under --out for this model and hardware first")
    s.add_argument("--requests", type=_positive(int), default=16, help="requests per benchmark run")
    s.add_argument("--prompt-tokens", type=_range, default=(112, 144), help="MIN:MAX prompt tokens")
    s.add_argument("--output-tokens", type=_positive(int), default=64)
    s.add_argument("--repeats", type=_positive(int), default=3, help="timed runs per trial (after a warm-up)")
    s.add_argument("--trial-timeout", type=_positive(float), default=600.0, help="seconds per trial (default 600)")
    s.add_argument("--timeout", type=_non_negative, default=10.0,
                   help="minutes of trials: no new trial once one more would likely end later (default 10, so "
                        "that the default search fits in 15 minutes on 2 cores; 0: no limit)")
    s.add_argument("--trial-memory-mb", type=_positive(float), default=None,
                   help="address-space limit of each trial's process, in MB (default: none)")
    s.add_argument("--isolate", action="store_true",
                   help="run each trial of an in-process backend (sim) in its own process (cpu always does)")
    s.add_argument("--workers", type=_positive(int), default=1, help="local worker processes (default 1)")
    s.add_argument("--storage-password-file", default=None,
                   help="file whose first line is the storage password (else $AUTOTUNE_STORAGE_PASSWORD)")

    w = sub.add_parser("worker", help="join a study started by `autotune search` and run its trials")
    w.add_argument("--study", required=True)
    w.add_argument("--storage", required=True, help="the study's SQLAlchemy URL (PostgreSQL for many machines)")
    w.add_argument("--storage-password-file", default=None,
                   help="file whose first line is the storage password (else $AUTOTUNE_STORAGE_PASSWORD)")
    w.add_argument("--worker-index", type=int, default=None, help=argparse.SUPPRESS)  # set by search --workers

    sh = sub.add_parser("show", help="the Pareto table of a study, from its storage")
    sh.add_argument("--study", required=True)
    sh.add_argument("--storage", default=None)

    sub.add_parser("models", help="the model registry")
    from autotune.sim_cmd import add_parsers

    add_parsers(sub, _positive, _range)  # predict, hardware
    from autotune import recipe_cmds

    recipe_cmds.add_parsers(sub, _positive, _range)  # export, verify, serve, loadtest
    from autotune import view_cmds

    view_cmds.add_parsers(sub)  # dashboard, report
    return parser


def _models() -> int:
    from autotune.models import REGISTRY

    print(f"{'name':<14} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>3} {'ffn':>6} {'vocab':>7} {'params':>7}  source")
    for spec in REGISTRY.values():
        print(f"{spec.name:<14} {spec.num_layers:>6} {spec.hidden_size:>6} {spec.num_heads:>5} "
              f"{spec.num_kv_heads:>3} {spec.intermediate_size:>6} {spec.vocab_size:>7} "
              f"{spec.num_params / 1e9:>6.2f}B  {spec.source}")
    print("or any local Hugging Face folder with a config.json")
    return 0


def _show(args) -> int:

    from autotune.results import pareto_table, study_summary
    from autotune.storage import load_existing_study

    study, _ = load_existing_study(args.study, args.storage)
    print(study_summary(study))
    print(pareto_table(study))
    return 0


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = _parser().parse_args(argv)
    try:
        if args.command == "models":
            return _models()
        if args.command == "show":
            return _show(args)
        if args.command in ("predict", "hardware"):
            from autotune.sim_cmd import run_command

            return run_command(args)
        from autotune import recipe_cmds

        if args.command in recipe_cmds.COMMANDS:
            return recipe_cmds.run_command(args)
        from autotune import view_cmds

        if args.command in view_cmds.COMMANDS:
            return view_cmds.run_command(args)
        # SIGTERM stops a search or a worker as Ctrl-C does: the running trial is failed and retried on resume.
        signal.signal(signal.SIGTERM, _interrupt)
        if args.command == "worker":
            from autotune.worker import worker

            return worker(args)
        from autotune.live import live_progress
        from autotune.search_cmd import search

        with live_progress():  # a live status on a terminal; plain lines otherwise
            return search(args)
    except UserInputError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"autotune: error: {exc}", file=sys.stderr)
        return 2
    except AutotuneError as exc:
        if args.debug:
            traceback.print_exc()
        print(f"autotune: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autotune: interrupted; finished trials are kept, run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
