"""The one place where autotune reaches into Optuna's non-public API, each use where Optuna 5 has no public one:
- heartbeats: Study.optimize starts a heartbeat thread per trial; an ask/tell loop has no public way to, so it
  uses the same thread Optuna uses (optuna.storages._heartbeat);
- a study's system attributes: optuna-dashboard keeps its artifact metadata there, and Study offers no setter;
- a trial's and a study's storage ids: optuna-dashboard's save_note, artifact keys and URLs take them, and
  Study and FrozenTrial expose only names and numbers;
- the storage itself (and its URL): Study keeps it private, and the stale-trial retry callback needs a frozen
  trial read from it.
Pinned by pyproject.toml's optuna==5.1.0; a change of these internals fails tests/test_study.py and
tests/test_annotate.py rather than a user's study."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna
from optuna.storages._heartbeat import get_heartbeat_thread

__all__ = ["storage_of", "storage_url", "study_id", "trial_id", "live_trial", "frozen_trial", "study_system_attrs",
           "set_study_system_attr", "heartbeat_thread"]


def storage_of(study: optuna.Study) -> optuna.storages.BaseStorage:
    return study._storage


def storage_url(study: optuna.Study, fallback: str) -> str:
    """The URL the study's storage was really opened with (callers may pass a display URL, as tests do)."""
    storage = getattr(study._storage, "_backend", study._storage)  # Optuna wraps RDBStorage in a cache
    return str(getattr(storage, "url", fallback))


def study_id(study: optuna.Study) -> int:
    """The storage's id of a study: optuna-dashboard's URLs name studies by it."""
    return study._study_id


def trial_id(trial: optuna.trial.FrozenTrial | optuna.Trial) -> int:
    return trial._trial_id


def live_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> optuna.Trial:
    """A Trial over a finished trial's id: it only reads, which is all optuna-dashboard's notes need."""
    return optuna.trial.Trial(study, trial._trial_id)


def frozen_trial(study: optuna.Study, trial: optuna.Trial) -> optuna.trial.FrozenTrial:
    return study._storage.get_trial(trial._trial_id)


def study_system_attrs(study: optuna.Study) -> dict[str, Any]:
    return dict(study._storage.get_study_system_attrs(study._study_id))


def set_study_system_attr(study: optuna.Study, key: str, value: Any) -> None:
    study._storage.set_study_system_attr(study._study_id, key, value)


@contextmanager
def heartbeat_thread(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    with get_heartbeat_thread(trial._trial_id, study._storage):
        yield
