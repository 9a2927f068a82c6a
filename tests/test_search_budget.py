"""The search spends its time budget, not a trial count: what stops it (and says so), repeats that cost nothing,
limits that keep to the deadline, compile costs that learn from every trial, timeouts included."""
from __future__ import annotations

import time
import types

import optuna
import pytest
from test_study import ScriptedBackend, _settings, _study

import autotune.study.trial_limit as trial_limit_module
from autotune.api.run import search_defaults
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.sim.hardware import load_profile
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.space.serving_knobs import offline_space
from autotune.study.compile_cost import PROBE_S_PER_UNIT, compile_estimate, compile_units
from autotune.study.coordination import tally
from autotune.study.loop import run_search
from autotune.study.trial_limit import trial_limit
from autotune.study.turns import MAX_REPEATS

SMOL = resolve_model("smollm2-135m")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))


def test_a_default_search_has_no_trial_cap():
    defaults = search_defaults()
    assert defaults["trials"] is None and defaults["minutes"] == 10.0 and defaults["patience"] >= 1


@pytest.mark.slow
def test_an_unmoving_front_stops_the_search_and_says_so(tmp_path, capsys):
    space = load_space(DEFAULT_SPACE)
    study = _study(tmp_path)
    # No trial cap and no deadline: only a stop rule can end this run.
    run_search(_settings(tmp_path, None, patience=4), space, ScriptedBackend(), study)
    out = capsys.readouterr().err + capsys.readouterr().out
    assert study.user_attrs["stopped_by"]["rule"] == "rule"
    assert "the front has not moved for 4 trials" in study.user_attrs["stopped_by"]["reason"]
    assert "search stopped after" in out and "the front has not moved" in out
    front = {t.number for t in study.best_trials}
    counted = sorted(t.number for t in study.trials if "duplicate_of" not in t.user_attrs and t.state.is_finished())
    assert len([n for n in counted if n > max(front)]) == 4  # exactly the patience, none more


def test_an_exhausted_space_stops_the_search(tmp_path, monkeypatch):
    space = offline_space(load_space(DEFAULT_SPACE))
    # Four configurations in all: the batch size alone varies.
    space = space.restrict("batch_size", (1, 2, 4, 8), "test").restrict("page_size", (128,), "test")
    for name in ("dtype", "quant", "fusion_level", "kv_policy", "device_power"):
        space = space.restrict(name, space.dimension(name).values[:1], "test")
    assert space.grid_size() == 4
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path}/s.db", directions=[
        "maximize", "minimize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    run_search(_settings(tmp_path, None, patience=None), space, ScriptedBackend(), study)
    assert study.user_attrs["stopped_by"]["reason"].startswith("the space is exhausted: all 4")
    measured = {t.params["batch_size"] for t in study.trials if "duplicate_of" not in t.user_attrs}
    assert measured == {1, 2, 4, 8}


class SameSampler(optuna.samplers.BaseSampler):
    """Proposes the first value of every parameter: after the baseline, every pick is a repeat."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, name, distribution):
        return distribution.choices[0] if hasattr(distribution, "choices") else distribution.low


@pytest.mark.slow
def test_a_repeat_is_told_its_result_costs_no_trial_and_a_sampler_that_only_repeats_ends_the_search(
        tmp_path, capsys):
    space = load_space(DEFAULT_SPACE)
    study, backend = _study(tmp_path), ScriptedBackend()
    study.sampler = SameSampler()
    run_search(_settings(tmp_path, 5, patience=None), space, backend, study)
    repeats = [t for t in study.trials if "repeat_of" in t.user_attrs]
    assert repeats and all(t.user_attrs["duplicate_of"] == t.user_attrs["repeat_of"] for t in repeats)
    first = study.trials[repeats[0].user_attrs["repeat_of"]]
    assert repeats[0].values == first.values  # the sampler is told the measured result
    assert study.user_attrs["repeats_skipped"] == len(repeats) == MAX_REPEATS
    # Each backend job is a distinct configuration, and the trial budget counted only those that ran: the
    # budget of 5 was never reached, the repeats ended the search.
    configs = [tuple(sorted(j.config.items())) for j in backend.jobs]
    assert len(configs) == len(set(configs)) == tally(study.trials)[0] < 5
    assert study.user_attrs["stopped_by"]["reason"].startswith("the sampler proposed only measured configurations")
    assert "not run, not counted" in capsys.readouterr().err


class HangingBackend(ScriptedBackend):
    """Every trial hangs until its limit kills it, as a compile that never ends would."""

    def run(self, job, timeout_s):
        self.jobs.append((time.time(), timeout_s))
        time.sleep(timeout_s)
        from autotune.trial.job import JobResult
        return JobResult.error(f"timed out after {timeout_s:g} s (the trial's wall-clock limit)")


def test_no_trial_ends_past_the_deadline_plus_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(trial_limit_module, "GRACE_S", 0.5)
    monkeypatch.setattr("autotune.study.loop.GRACE_S", 0.5)
    space = load_space(DEFAULT_SPACE)
    study, backend = _study(tmp_path), HangingBackend()
    deadline = time.time() + 2.0
    # The backend has no profile: its first limit would be NO_PROFILE_S (1800 s) unclamped.
    run_search(_settings(tmp_path, None, timeout_s=2.0, deadline=deadline), space, backend, study)
    ended = [t.datetime_complete.timestamp() for t in study.trials if t.datetime_complete]
    assert backend.jobs and ended
    assert max(ended) <= deadline + 0.5 + 0.5, (max(ended) - deadline)  # the grace, and the storage's writes
    assert all("clamped to the" in t.user_attrs["trial_limit"]["reason"] for t in study.trials
               if "trial_limit" in t.user_attrs)


def test_the_first_trial_of_a_worker_is_checked_against_the_budget_too(tmp_path):
    """A worker joining with 5 s left, where this study's trials took 100 s each: it runs nothing."""
    space = load_space(DEFAULT_SPACE)
    study, backend = _study(tmp_path), ScriptedBackend()
    run_search(_settings(tmp_path, 2), space, backend, study)
    for _ in range(2):  # what two earlier trials of 100 s each left in the study
        study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.COMPLETE, values=[1.0, 1.0, 1.0],
                                                  user_attrs={"trial_seconds": 100.0}))
    ran = len(backend.jobs)
    run_search(_settings(tmp_path, None, timeout_s=600.0, deadline=time.time() + 5.0, guided=False), space,
               backend, study)
    assert len(backend.jobs) == ran
    assert study.user_attrs["stopped_by"]["rule"] == "time"


def _timed_out(config: DeployConfig, wall: float, parts: dict | None = None, timing: dict | None = None):
    return types.SimpleNamespace(number=9, state=optuna.trial.TrialState.FAIL, user_attrs={
        "config": config.to_dict(), "trial_seconds": wall, "timing": timing or {},
        "reason": f"timed out after {wall:g} s (the trial's wall-clock limit)",
        "trial_limit": {"seconds": wall, "parts": parts or {}}})


def test_compile_cost_comes_from_the_probe_then_from_this_studys_trials_timeouts_included():
    o1 = DeployConfig(quant="none", dtype="bf16", fusion_level="O1", layers_per_subgraph=4)
    units = compile_units(o1, SMOL.num_layers)
    assert units == (1 + 4) + (1 + 2) + 1  # segments of 4 share a graph, the last of 2 has its own, the head
    fast = compile_estimate(o1, SMOL.num_layers, [], 5.0, 30.0)
    slow = compile_estimate(o1, SMOL.num_layers, [], 10.0, 30.0)
    assert slow.seconds == pytest.approx(2 * fast.seconds) == pytest.approx(units * PROBE_S_PER_UNIT["O1"] * 10.0)
    assert "probe" in fast.how
    measured = types.SimpleNamespace(number=3, state=optuna.trial.TrialState.COMPLETE, user_attrs={
        "config": o1.to_dict(), "timing": {"compile_s": 90.0}})
    learnt = compile_estimate(o1, SMOL.num_layers, [measured], 5.0, 30.0)
    assert learnt.seconds == pytest.approx(90.0) and "measured" in learnt.how
    # A trial killed before its gate finished compiled for at least its wall time less loading: a lower bound.
    killed = _timed_out(o1, 400.0)
    raised = compile_estimate(o1, SMOL.num_layers, [measured, killed], 5.0, 30.0)
    assert raised.seconds == pytest.approx(370.0) and "lower bound" in raised.how
    # Another split of the same level is scaled by its units.
    split_all = DeployConfig(quant="none", dtype="bf16", fusion_level="O1", layers_per_subgraph=0)
    assert compile_estimate(split_all, SMOL.num_layers, [killed], 5.0, 30.0).seconds == pytest.approx(
        370.0 / units * compile_units(split_all, SMOL.num_layers))


def test_a_timeout_raises_the_next_prediction():
    profile = load_profile("a100-80g")
    eager = DeployConfig(quant="none", dtype="bf16", batch_size=8)
    before = trial_limit(SMOL, eager, Workload(), profile, [], repeats=3, repeat_time_s=60)
    killed = _timed_out(eager, before.seconds, parts=before.parts)
    after = trial_limit(SMOL, eager, Workload(), profile, [killed], repeats=3, repeat_time_s=60)  # type: ignore[list-item]
    assert after.expected_s > before.expected_s and after.seconds >= before.seconds
    o1 = DeployConfig(quant="none", dtype="bf16", fusion_level="O1", layers_per_subgraph=4)
    first = trial_limit(SMOL, o1, Workload(), profile, [], repeats=3, repeat_time_s=60, probe_compile_s=5.0)
    compile_killed = _timed_out(o1, first.seconds, parts=first.parts)
    second = trial_limit(SMOL, o1, Workload(), profile, [compile_killed], repeats=3, repeat_time_s=60,
                         probe_compile_s=5.0)  # type: ignore[list-item]
    assert second.parts["compile_s"] > first.parts["compile_s"] and second.expected_s > first.expected_s


def test_a_limit_is_clamped_to_the_time_left_plus_grace():
    profile = load_profile("a100-80g")
    config = DeployConfig(quant="none", dtype="bf16", batch_size=8)
    free = trial_limit(SMOL, config, Workload(), profile, [], repeats=3, repeat_time_s=60)
    clamped = trial_limit(SMOL, config, Workload(), profile, [], repeats=3, repeat_time_s=60, left_s=20.0)
    assert free.seconds > 80 and clamped.seconds == 20.0 + trial_limit_module.GRACE_S
    assert clamped.reason.startswith("clamped to the 20 s left")
