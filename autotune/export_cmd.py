"""`autotune export`: the Pareto front of a stored study as recipes, plus the named picks."""
from __future__ import annotations

import optuna

from autotune.errors import UserInputError
from autotune.results import study_summary, write_recipes
from autotune.storage import load_existing_study

__all__ = ["export", "load_study"]


def load_study(name: str, url: str | None) -> tuple[optuna.Study, str]:
    return load_existing_study(name, url)


def export(args) -> int:
    study, url = load_study(args.study, args.storage)
    if "model" not in study.user_attrs or "hardware" not in study.user_attrs:
        raise UserInputError(f"study {args.study!r} was not made by autotune search (no model or hardware attributes)")
    print(study_summary(study))
    written = write_recipes(study, args.out, url)
    if not written:
        raise UserInputError(f"study {args.study!r} has no feasible, gate-passing trial yet: nothing to export")
    for path in written:
        print(f"recipe: {path}")
    return 0
