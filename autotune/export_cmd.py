"""`autotune export`: the Pareto front of a stored study as recipes, plus the named picks."""
from __future__ import annotations

import optuna

from autotune.errors import UserInputError
from autotune.results import study_summary, write_recipes
from autotune.storage import default_storage, open_storage, redact

__all__ = ["export", "load_study"]


def load_study(name: str, url: str | None) -> tuple[optuna.Study, str]:
    url = url or default_storage(name)
    storage = open_storage(url)
    try:
        return optuna.load_study(study_name=name, storage=storage), url
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UserInputError(f"no study {name!r} in {redact(url)}; studies there: {names or 'none'}") from None


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
