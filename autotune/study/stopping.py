"""When a search stops before its time budget: the space is exhausted (every configuration measured), or the front
has not moved for `patience` trials (none of the last that many is on it). Both read the study's storage alone, so
every worker of a study reaches the same verdict; each says, in one line, which rule stopped the search.

A trial counts here as it counts in the budget (coordination.tally): a repeat of a measured configuration, a
sampler's pick not run for the time left and an interrupted trial that was retried are no trials."""
from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from autotune.space.search_space import SearchSpace
from autotune.study.coordination import counted

__all__ = ["stop_reason", "DEFAULT_PATIENCE"]

# Trials without a new front point before a search with time left stops. On the 2-core machines a default study
# runs 8-20 trials in its 10 minutes; the guide proposes the predicted front first, so a dozen trials off the
# front mean the model and the sampler have both run out of better ideas.
DEFAULT_PATIENCE = 12


def _stalled(study: optuna.Study, trials: list[FrozenTrial], patience: int) -> str | None:
    done = sorted((t for t in counted(trials) if t.state.is_finished()), key=lambda t: t.number)
    front = {t.number for t in study.best_trials if "duplicate_of" not in t.user_attrs}
    last = max((t.number for t in done if t.number in front), default=None)
    since = [t for t in done if last is None or t.number > last]
    if len(since) < patience:
        return None
    where = f"the last on it is trial #{last}" if last is not None else "no trial has reached it"
    return f"the front has not moved for {len(since)} trials (patience {patience}; {where})"


def _exhausted(trials: list[FrozenTrial], space: SearchSpace) -> str | None:
    measured = {tuple(sorted(t.params.items())) for t in counted(trials) if t.state.is_finished() and t.params}
    size = space.grid_size()
    if len(measured) < size:
        return None
    return f"the space is exhausted: all {size} of its configurations were measured"


def stop_reason(study: optuna.Study, space: SearchSpace, patience: int | None) -> str | None:
    """Why the search should stop now, or None to go on. `patience` None: only an exhausted space stops it."""
    trials = study.get_trials(deepcopy=False)
    return _exhausted(trials, space) or (_stalled(study, trials, patience) if patience else None)
