"""Isolated trials: a segfault, a hang, an out-of-memory and an exception each fail their own trial with the
reason and the log's last lines, while the study completes (on PostgreSQL when available, else SQLite)."""
from __future__ import annotations

import json
import os

import optuna
import pytest
from optuna.trial import TrialState

from autotune.backends.faults import FAULTS_ENV, FaultBackend
from autotune.backends.isolated import IsolatedBackend
from autotune.config.deploy import DeployConfig
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.study.loop import run_search
from autotune.study.settings import OBJECTIVES, SearchSettings, make_sampler


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")


@pytest.mark.slow
def test_faulty_trials_fail_with_their_reason_and_the_study_completes(tmp_path, monkeypatch):
    import uuid

    url = os.environ.get("AUTOTUNE_TEST_PG_URL") or f"sqlite:///{tmp_path}/s.db"
    name = f"faults-{uuid.uuid4().hex[:8]}"
    space = load_space(DEFAULT_SPACE)
    base = space.baseline_params()
    faulty = {"segfault": {**base, "batch_size": 2}, "hang": {**base, "batch_size": 4},
              "oom": {**base, "batch_size": 16}, "raise": {**base, "batch_size": 1}}
    monkeypatch.setenv(FAULTS_ENV, json.dumps({DeployConfig.from_params(p).label(): f for f, p in faulty.items()}))
    study = optuna.create_study(study_name=name, storage=url, directions=[d for _, d in OBJECTIVES],
                                sampler=make_sampler("random", 0))
    study.set_user_attr("model_checksum", "none")
    study.set_user_attr("eval_digest", "none")
    for params in faulty.values():
        study.enqueue_trial(params)
    backend = IsolatedBackend(FaultBackend("a100-80g"), memory_limit_mb=400)
    space = backend.adapt_space(space)
    # The limit must hold a healthy trial's child (Python, autotune's backends, the simulator) on a loaded machine:
    # 4 s did not, in the full suite on a 2-core EPYC, where a child took 3-4 s to start and answer.
    settings = SearchSettings(model="llama-7b", study=name, storage=url, trials=8, trial_timeout_s=15.0,
                              trial_memory_mb=400)
    run_search(settings, space, backend, study)
    trials = {DeployConfig.from_params(t.params).label(): t for t in study.trials}
    reasons = {f: trials[DeployConfig.from_params(p).label()].user_attrs["reason"] for f, p in faulty.items()}
    assert "SIGSEGV" in reasons["segfault"] and "segmentation fault" in reasons["segfault"]
    assert "timed out after 15 s" in reasons["hang"]
    assert "out of memory" in reasons["oom"] and "400 MB" in reasons["oom"]
    assert "RuntimeError: injected build failure" in reasons["raise"]
    for fault, params in faulty.items():
        t = trials[DeployConfig.from_params(params).label()]
        assert t.state == TrialState.FAIL
        assert any(f"fault injection: {fault}" in line for line in t.user_attrs["log_tail"])
    done = [t for t in study.trials if t.state.is_finished()]
    assert len(done) == 8 and sum(t.state == TrialState.COMPLETE for t in done) == 4  # the study went on
