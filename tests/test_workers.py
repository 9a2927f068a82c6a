"""Workers on a real PostgreSQL (scripts/pg.sh; skipped without $AUTOTUNE_TEST_PG_URL): three workers share a
study without losing or repeating a trial; a worker killed with SIGKILL has its trial retried by another."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import optuna
import pytest
from optuna.trial import TrialState

PG_URL = os.environ.get("AUTOTUNE_TEST_PG_URL")
pytestmark = pytest.mark.skipif(not PG_URL, reason="needs PostgreSQL: eval \"$(bash scripts/pg.sh start)\"")


def _split(url: str) -> tuple[str, str]:
    """The URL without its password, and the password (it then travels in $AUTOTUNE_STORAGE_PASSWORD)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    return parsed.set(password=None).render_as_string(hide_password=False), parsed.password or ""


def _env(tmp_path, **extra) -> dict:
    _, password = _split(PG_URL)
    return {**os.environ, "AUTOTUNE_CACHE": str(tmp_path / "cache"), "AUTOTUNE_HEARTBEAT_S": "1",
            "AUTOTUNE_STORAGE_PASSWORD": password, "HF_HUB_OFFLINE": "1", **extra}


def _search(tmp_path, study: str, trials: int, workers: int, backend: str = "sim", *extra: str) -> list[str]:
    bare, _ = _split(PG_URL)
    return [sys.executable, "-m", "autotune.cli", "search", "--backend", backend, "--hardware", "a100-80g",
            "--model", "llama-7b", "--study", study, "--storage", bare, "--trials", str(trials),
            "--workers", str(workers), "--sampler", "random", "--seed", "3", "--out", str(tmp_path / "recipes"),
            *extra]


def _trials(study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=PG_URL).get_trials(deepcopy=False)


def _check_no_lost_no_repeated(trials: list[optuna.trial.FrozenTrial], budget: int, workers: int) -> None:
    retried = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    done = [t for t in trials if t.state.is_finished() and t.number not in retried]
    # Workers check the budget before they ask, as Optuna's MaxTrialsCallback does: at most one extra each.
    assert budget <= len(done) <= budget + workers - 1
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    evaluated = [t for t in done if "duplicate_of" not in t.user_attrs and t.state == TrialState.COMPLETE]
    configs = [json.dumps(t.params, sort_keys=True) for t in evaluated]
    assert len(configs) == len(set(configs)), "a configuration was evaluated twice"
    by_number = {t.number: t for t in trials}
    for t in done:
        if "duplicate_of" in t.user_attrs:
            assert by_number[t.user_attrs["duplicate_of"]].params == t.params


@pytest.mark.slow
def test_three_workers_complete_a_30_trial_study(tmp_path):
    study = f"w3-{uuid.uuid4().hex[:8]}"
    _, password = _split(PG_URL)
    proc = subprocess.run(_search(tmp_path, study, 30, 3), env=_env(tmp_path), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = _trials(study)
    _check_no_lost_no_repeated(trials, 30, 3)
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 3  # all three took part
    # The secret never shows: not in the output, not in the recipes, not in the workers' command lines.
    assert password and password not in proc.stdout + proc.stderr
    recipes = "".join(p.read_text() for p in (tmp_path / "recipes").rglob("*.yaml"))
    assert recipes and password not in recipes
    rates = optuna.load_study(study_name=study, storage=PG_URL).user_attrs["cache_hit_rates"]
    assert rates["duplicate_results_reused"] == sum("duplicate_of" in t.user_attrs for t in trials)


@pytest.mark.slow
def test_a_worker_killed_mid_trial_has_its_trial_retried(tmp_path):
    study = f"kill-{uuid.uuid4().hex[:8]}"
    env = _env(tmp_path, AUTOTUNE_FAULTS=json.dumps({"*": "sleep:0.7"}))  # slow, healthy trials
    search = subprocess.Popen(_search(tmp_path, study, 10, 2, "sim-faults"), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    victim = None
    deadline = time.monotonic() + 60
    while victim is None and time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            running = [t for t in _trials(study) if t.state == TrialState.RUNNING and "worker" in t.user_attrs]
        except KeyError:  # the study does not exist yet
            continue
        if running and running[0].number >= 2:
            victim = running[0]
    assert victim is not None, "no trial ever ran"
    os.kill(int(victim.user_attrs["worker"].rsplit(":", 1)[1]), signal.SIGKILL)
    _, err = search.communicate(timeout=120)
    assert search.returncode == 0, err[-3000:]
    trials = _trials(study)
    killed = next(t for t in trials if t.number == victim.number)
    assert killed.state == TrialState.FAIL
    retry = next(t for t in trials if victim.number in t.system_attrs.get("retry_history", []))
    assert retry.state == TrialState.COMPLETE and retry.params == killed.params
    _check_no_lost_no_repeated(trials, 10, 2)


@pytest.mark.slow
def test_a_worker_joins_a_study_and_stops_at_its_budget(tmp_path):
    study = f"join-{uuid.uuid4().hex[:8]}"
    first = subprocess.run(_search(tmp_path, study, 4, 1), env=_env(tmp_path), capture_output=True, text=True,
                           timeout=120)
    assert first.returncode == 0, first.stderr[-2000:]
    optuna.load_study(study_name=study, storage=PG_URL).set_user_attr("target_trials", 7)  # the budget grows
    bare, _ = _split(PG_URL)
    joined = subprocess.run([sys.executable, "-m", "autotune.cli", "worker", "--study", study, "--storage", bare],
                            env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert joined.returncode == 0, joined.stderr[-2000:]
    _check_no_lost_no_repeated(_trials(study), 7, 1)
