"""What every subcommand shares: the parser that fails in one line, and the argument types that say what is wrong."""
from __future__ import annotations

import argparse
import sys

from autotune.config.slo import parse_slo

__all__ = ["Parser", "positive", "non_negative", "fraction", "token_range"]


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line and exit 2, as for every other bad input
        print(f"autotune: error: {message} (see autotune {self.prog.split()[-1]} --help)", file=sys.stderr)
        sys.exit(2)


def _number(kind, holds, requirement: str):
    """An argument type: `kind` parsed from the text, refused in one line unless `holds(value)`."""
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not holds(value):
            raise argparse.ArgumentTypeError(f"{text!r} must be {requirement}")
        return value
    return parse


def positive(kind):
    return _number(kind, lambda v: v > 0, "positive")


non_negative = _number(float, lambda v: v >= 0, "0 or more")
fraction = _number(float, lambda v: 0.0 <= v <= 1.0, "between 0 and 1")


def token_range(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi or lo))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX token counts") from None
    if not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r} needs 1 <= MIN <= MAX")
    return pair


def slo_text(text: str) -> str:
    """An SLO as `--slo` takes it (config/slo.parse_slo), checked here so that a malformed one is exit 2."""
    try:
        parse_slo(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text
