"""The `autotune` command line: one parser, each subcommand registered by its group's module, which sets
`func` (and `interruptible` where SIGTERM must stop a study as Ctrl-C does)."""
from __future__ import annotations

import argparse
import os
import signal
import sys
import traceback

from autotune.cli import loadtest, models, quant_report, recipes, search, sim, views, worker
from autotune.cli.args import Parser
from autotune.errors import AutotuneError, UserInputError

__all__ = ["main", "build_parser"]

_GROUPS = (search, worker, views, models, sim, recipes, loadtest, quant_report)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="autotune", description="Search the deployment knobs of a language model.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for group in _GROUPS:
        group.register(sub)
    return parser


def _interrupt(signum: int, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    try:
        if getattr(args, "interruptible", False):
            # SIGTERM stops a search or a worker as Ctrl-C does: the running trial is failed and retried on resume.
            signal.signal(signal.SIGTERM, _interrupt)
        return args.func(args)
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
