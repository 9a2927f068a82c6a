"""How trials are shared between workers through the study's storage alone (no coordinator): the budget, the
heartbeat of a running trial, waiting for a twin configuration another worker is evaluating, and failing a
trial that was interrupted so that it is retried."""
from __future__ import annotations

import os
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.progress import log
from autotune.study.optuna_private import frozen_trial, heartbeat_thread

__all__ = ["NOT_RUN_ATTR", "counted", "tally", "budget_target", "wait_for_slot", "running_twin", "wait_for_twin",
           "heartbeat",
           "fail_and_retry", "worker_id", "POLL_S"]

POLL_S = 0.5
# Optuna warns that heartbeats are meant for Study.optimize; ask/tell with our own heartbeat thread is the same.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used")
TARGET_ATTR = "target_trials"
NOT_RUN_ATTR = "not_run"


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def counted(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials that count in a budget. A failed trial that was retried is replaced by its retry; a sampler's
    pick that was not run (it would have ended past the time budget) and a repeat of a configuration already
    measured (its result reused: `duplicate_of`) cost nothing, so they are no trials either."""
    superseded = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    return [t for t in trials if t.number not in superseded and not t.user_attrs.get(NOT_RUN_ATTR)
            and "duplicate_of" not in t.user_attrs]


def tally(trials: list[FrozenTrial]) -> tuple[int, int, int]:
    """(done, running, waiting), done as `counted` counts."""
    done = sum(t.state.is_finished() for t in counted(trials))
    running = sum(t.state == TrialState.RUNNING for t in trials)
    waiting = sum(t.state == TrialState.WAITING for t in trials)
    return done, running, waiting


def budget_target(study: optuna.Study, new_trials: int | None) -> int | None:
    """The study's total budget of trials: `new_trials` more than are done (finished trials are kept, --trials
    counts new ones, also after an interrupted or time-limited run); None: no count, the time budget and the stop
    rules (stopping.py) end it. Stored on the study, where `autotune worker` reads it."""
    done, _, _ = tally(study.get_trials(deepcopy=False))
    target = None if new_trials is None else done + new_trials
    study.set_user_attr(TARGET_ATTR, target)
    return target


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # a dead worker's trial: FAIL, and its retry enqueued


def wait_for_slot(study: optuna.Study, target: int | None, patience_s: float) -> int | None:
    """The number of done trials when this worker should ask for a trial; None when it should stop. The budget
    bounds enqueued trials too (warm start, retries): what is left waiting runs first next time. When the budget
    is taken but other workers' trials are still running, wait: if one of them dies, its retry needs a live
    worker. Gives up after `patience_s` (longer than any trial may run), so that a trial left RUNNING without a
    heartbeat cannot hold it forever. `target` None: no count bounds the trials."""
    since = time.monotonic()
    while True:
        _fail_stale(study)
        done, running, waiting = tally(study.get_trials(deepcopy=False))
        if target is None or done + running < target:
            return done
        if not running or time.monotonic() - since > patience_s:
            return None
        time.sleep(POLL_S)


def running_twin(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial | None:
    """An earlier trial with the same parameters that another worker is evaluating now. Only earlier ones are
    waited for, so that two twins never wait for each other."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.number < trial.number and t.params == trial.params:
            return t
    return None


def wait_for_twin(study: optuna.Study, trial: optuna.Trial, grace_s: float, default_limit_s: float) -> None:
    """Wait while another worker evaluates the same configuration: as long as the twin's own limit (recorded when it
    started; `default_limit_s` before it was) plus `grace_s`, so that a twin within its limit is never given up on
    and evaluated twice."""
    twin = running_twin(study, trial)
    if twin is None:
        return
    log(f"  trial #{twin.number} (another worker) is evaluating the same configuration: waiting for its result")
    since = time.monotonic()

    def patience_s(t: FrozenTrial) -> float:
        return float((t.user_attrs.get("trial_limit") or {}).get("seconds") or default_limit_s) + grace_s

    while twin is not None and time.monotonic() - since < patience_s(twin):
        time.sleep(POLL_S)
        _fail_stale(study)
        twin = running_twin(study, trial)


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Records this trial's heartbeat while it runs; when the worker dies, the heartbeat stops and another
    worker fails the trial after the grace period and retries it once (autotune/study/storage.py)."""
    with heartbeat_thread(study, trial):
        yield


def fail_and_retry(study: optuna.Study, trial: optuna.Trial, reason: str) -> None:
    """Mark an unfinished trial FAIL with `reason` and enqueue it again (the interrupted trial is retried)."""
    try:
        trial.set_user_attr("reason", reason)
        study.tell(trial, state=TrialState.FAIL)
    except (optuna.exceptions.UpdateFinishedTrialError, RuntimeError, ValueError):
        return  # already finished (told, or failed as stale by another worker, which enqueued the retry)
    frozen = frozen_trial(study, trial)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=None)(study, frozen)
