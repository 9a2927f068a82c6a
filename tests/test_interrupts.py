"""SIGTERM (as Ctrl-C) stops a search cleanly: the running trial fails and is retried, finished trials stay, and
the same command resumes to the study's budget. Storage errors are one clear line without the password."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from autotune.redact import redact, scrub
from autotune.study.coordination import counted
from autotune.study.storage import resolve_url


def _env(tmp_path) -> dict:
    return {**os.environ, "AUTOTUNE_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
            "AUTOTUNE_FAULTS": json.dumps({"*": "sleep:0.5"})}


@pytest.mark.slow
def test_sigterm_fails_the_running_trial_and_the_same_command_resumes(tmp_path):
    url = f"sqlite:///{tmp_path}/s.db"
    cmd = [sys.executable, "-m", "autotune.cli", "search", "--backend", "sim-faults", "--hardware", "a100-80g",
           "--model", "llama-7b", "--study", "s", "--storage", url, "--trials", "6", "--sampler", "random",
           "--seed", "1", "--out", str(tmp_path / "recipes")]
    proc = subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.2)
        try:
            trials = optuna.load_study(study_name="s", storage=url).trials
        except (KeyError, Exception):  # noqa: BLE001 - the study or its tables do not exist yet
            continue
        # A running trial whose configuration is complete ("config" is set after every parameter is suggested):
        # one caught between ask and its last suggest is retried with what it had, not with one configuration.
        if (sum(t.state == TrialState.COMPLETE for t in trials) >= 2 and trials[-1].state == TrialState.RUNNING
                and "config" in trials[-1].user_attrs):
            break
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err[-2000:]
    assert "run the same command to resume" in err
    trials = optuna.load_study(study_name="s", storage=url).trials
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(failed) == 1 and "interrupted" in failed[0].user_attrs["reason"]
    assert any(t.state == TrialState.WAITING and t.params == failed[0].params for t in trials)  # queued again
    finished_before = {t.number: t.values for t in trials if t.state == TrialState.COMPLETE}

    again = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    trials = optuna.load_study(study_name="s", storage=url).trials
    assert {t.number: t.values for t in trials if t.number in finished_before} == finished_before
    complete = [t for t in counted(trials) if t.state == TrialState.COMPLETE]  # a sampler's repeat is no trial
    assert len(complete) == len(finished_before) + 6  # resumed: the finished are kept, --trials counts new ones
    retried = [t for t in complete if t.system_attrs.get("failed_trial") == failed[0].number]
    assert len(retried) == 1 and retried[0].params == failed[0].params  # the interrupted trial, run again


@pytest.mark.slow
def test_unreachable_storage_is_one_clear_error_without_the_password(tmp_path):
    url = "postgresql+psycopg://tuner:s3cret-pw@127.0.0.1:1/autotune"
    proc = subprocess.run([sys.executable, "-m", "autotune.cli", "worker", "--study", "x", "--storage", url],
                          env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autotune: error: cannot open study storage")
    assert "tuner:***@127.0.0.1:1" in lines[0] and "s3cret-pw" not in proc.stderr + proc.stdout


def test_password_from_environment_or_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_STORAGE_PASSWORD", "from-env")
    assert resolve_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u:from-env@h/db"
    secret = tmp_path / "pw"
    secret.write_text("p@ss:word\n")
    url = resolve_url("postgresql+psycopg://u@h/db", str(secret))
    assert redact(url) == "postgresql+psycopg://u:***@h/db"
    assert scrub(f"failed for {url}", url) == "failed for postgresql+psycopg://u:***@h/db"
    assert resolve_url("sqlite:///studies/x.db") == "sqlite:///studies/x.db"
