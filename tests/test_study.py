"""The study loop with a scripted backend: gate failures never benchmarked nor on the front; resume; errors."""
from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune.backends.base import Backend
from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.results.export import write_recipes
from autotune.results.front import pareto_trials
from autotune.results.tables import pareto_table
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.space.serving_knobs import offline_space
from autotune.study.coordination import tally
from autotune.study.loop import run_search
from autotune.study.settings import OBJECTIVES, SearchSettings, make_sampler
from autotune.study.setup import enqueue_baseline
from autotune.trial.job import JobResult, Status


class ScriptedBackend(Backend):
    """Answers trials from the configuration alone: w8a8 fails the gate, w4a16 crashes, the rest run."""

    name = "scripted"

    def __init__(self) -> None:
        self.jobs: list = []

    def unavailable(self):
        return None

    def adapt_space(self, space):
        return space

    def fingerprint(self):
        return {"hardware": "test-machine"}

    def run(self, job, timeout_s):
        self.jobs.append(job)
        config = DeployConfig.from_dict(job.config)
        agreement = 0.98 if config.quant == "w8a8" else 0.999
        gate = {"tie_aware_agreement": agreement, "raw_agreement": 0.9, "perplexity": 25.0,
                "reference_perplexity": 24.9, "kl_divergence": 0.01, "decode_agreement": 0.999,
                "decode_raw_agreement": 0.98, "decode_positions": 1024, "positions": 5110, "tie_epsilon": 0.05,
                "min_agreement": 0.995,
                "passed": agreement > 0.995}
        if config.quant == "w4a16":
            return JobResult.error("RuntimeError: kernel missing", ["boom"])
        if not gate["passed"]:
            return JobResult(Status.GATED, gate=gate)
        tput = 100.0 * config.batch_size ** 0.5 * (1.3 if config.fusion_level != "O0" else 1.0)
        bench = {"throughput_tok_s": tput, "throughput_min": tput, "throughput_max": tput,
                 "tpot_p50_ms": 9.0, "tpot_p99_ms": 10.0 + config.batch_size, "ttft_p50_ms": 50.0,
                 "ttft_p99_ms": 60.0, "peak_memory_mb": 300.0 + 10 * config.batch_size + config.page_size / 8,
                 "kv_reserved_peak_mb": 1.0, "repeats": 1}
        return JobResult(Status.OK, gate=gate, bench=bench)


def _study(tmp_path, name="s"):
    """The study as the set-up leaves it: its model's digests recorded, the baseline trial queued (once)."""
    study = optuna.create_study(study_name=name, storage=f"sqlite:///{tmp_path}/{name}.db", load_if_exists=True,
                                directions=[d for _, d in OBJECTIVES], sampler=make_sampler("random", 0))
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    enqueue_baseline(study, offline_space(load_space(DEFAULT_SPACE)))
    return study


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))


def _settings(tmp_path, trials, **kw):
    return SearchSettings(model="m", study="s", storage=f"sqlite:///{tmp_path}/s.db", trials=trials, **kw)


@pytest.mark.slow
def test_gated_and_failed_trials_are_recorded_but_never_benchmarked_or_on_the_front(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    study, backend = _study(tmp_path), ScriptedBackend()
    run_search(_settings(tmp_path, 40), space, backend, study)
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.PRUNED in states and optuna.trial.TrialState.FAIL in states
    for t in study.trials:
        quant = t.params["quant"]
        if quant == "w8a8":
            assert t.state == optuna.trial.TrialState.PRUNED and "bench" not in t.user_attrs
            assert "accuracy gate" in t.user_attrs["reason"] and t.user_attrs["gate"]["tie_aware_agreement"] == 0.98
        if quant == "w4a16":
            assert t.state == optuna.trial.TrialState.FAIL and "kernel missing" in t.user_attrs["reason"]
    front = pareto_trials(study)
    assert front and all(t.params["quant"] not in ("w8a8", "w4a16") for t in front)
    study.set_user_attr("model", "m")
    study.set_user_attr("model_source", "test")
    study.set_user_attr("backend", "scripted")
    study.set_user_attr("hardware", {"hardware": "test-machine"})
    study.set_user_attr("workload", Workload().to_dict())
    written = write_recipes(study, tmp_path / "recipes", "sqlite:///x.db")
    assert {p.name for p in written} >= {"best-throughput.yaml", "best-latency.yaml", "smallest-memory.yaml"}
    assert "w8a8" not in "".join(p.read_text() for p in written)
    assert "gain" in pareto_table(study)


def test_baseline_is_the_first_trial(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    study = _study(tmp_path)
    run_search(_settings(tmp_path, 2), space, ScriptedBackend(), study)
    assert study.trials[0].params == space.baseline_params()
    assert study.trials[0].user_attrs["role"] == "baseline"


@pytest.mark.slow
def test_resume_keeps_finished_trials_and_counts_new_ones(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    run_search(_settings(tmp_path, 3), space, ScriptedBackend(), _study(tmp_path))
    first = [(t.number, t.params, t.values) for t in _study(tmp_path).trials]
    run_search(_settings(tmp_path, 4), space, ScriptedBackend(), _study(tmp_path))
    again = _study(tmp_path).trials
    # Repeats of a measured configuration (told its result, marked duplicate_of) cost no trial of the budget.
    assert len([t for t in again if "duplicate_of" not in t.user_attrs]) == 7
    assert [(t.number, t.params, t.values) for t in again[:len(first)]] == first
    assert sum(t.user_attrs.get("role") == "baseline" for t in again) == 1  # not enqueued twice


def test_duplicate_configuration_reuses_the_stored_result(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    study, backend = _study(tmp_path), ScriptedBackend()
    base = space.baseline_params()
    run_search(_settings(tmp_path, 1), space, backend, study)
    study.enqueue_trial(base)
    run_search(_settings(tmp_path, 1), space, backend, study)
    assert study.trials[1].user_attrs["duplicate_of"] == 0 and study.trials[1].values == study.trials[0].values
    # The repeat cost no trial: the second run's one trial of budget went to another configuration.
    assert len(backend.jobs) == 2 and backend.jobs[1].config != backend.jobs[0].config
    assert tally(study.trials)[0] == 2


def test_cached_gate_failure_skips_the_build(tmp_path):
    from autotune.gate.cache import gate_inputs, gate_key, store_gate

    space = offline_space(load_space(DEFAULT_SPACE))
    study, backend = _study(tmp_path), ScriptedBackend()
    params = {**space.baseline_params(), "quant": "w8a16", "fallback_layers": 0}
    config = DeployConfig.from_params(params)
    figures = {"tie_aware_agreement": 0.9, "raw_agreement": 0.8, "perplexity": 30.0, "reference_perplexity": 25.0,
               "kl_divergence": 0.1, "positions": 5110, "tie_epsilon": 0.05, "min_agreement": 0.995}
    store_gate(gate_key(gate_inputs("sha256:x", "d", config, tie_epsilon=0.05, min_agreement=0.995,
                                    device=backend.name, threads=config.device_power)), figures)
    study.enqueue_trial(params)
    run_search(_settings(tmp_path, 2), space, backend, study)
    # The baseline ran; the w8a16 trial was decided by the cached gate, without a build.
    assert [DeployConfig.from_dict(j.config).quant for j in backend.jobs] == ["none"]
    gated = next(t for t in study.trials if t.params["quant"] == "w8a16")
    assert gated.state == optuna.trial.TrialState.PRUNED and gated.user_attrs["gate_cached"]
    assert gated.user_attrs["reason"].startswith("accuracy gate: tie-aware agreement 0.9000 <= 0.995")


@pytest.mark.slow
def test_memory_budget_makes_trials_infeasible(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    study = _study(tmp_path)
    run_search(_settings(tmp_path, 15, memory_budget_mb=340.0), space, ScriptedBackend(), study)
    front = pareto_trials(study)
    assert all(t.user_attrs["bench"]["peak_memory_mb"] <= 340.0 for t in front)
    assert any(t.user_attrs.get("bench", {}).get("peak_memory_mb", 0) > 340.0 for t in study.trials)


def test_enqueued_trials_do_not_exceed_the_budget(tmp_path):
    space = offline_space(load_space(DEFAULT_SPACE))
    study = _study(tmp_path)
    base = space.baseline_params()
    for batch_size in (1, 2, 4):
        study.enqueue_trial({**base, "batch_size": batch_size})
    run_search(_settings(tmp_path, 2), space, ScriptedBackend(), study)
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2
    assert states.count(optuna.trial.TrialState.WAITING) == 2  # left for the next run, which takes them first


@pytest.mark.parametrize("change", [{"min_agreement": 0.99}, {"tie_epsilon": 0.02},
                                    {"workload": Workload(num_requests=4, prompt_min=12, prompt_max=20,
                                                          output_tokens=8)}])
def test_a_duplicate_is_measured_again_under_other_gate_or_workload_settings(tmp_path, change):
    space = offline_space(load_space(DEFAULT_SPACE))
    study, backend = _study(tmp_path), ScriptedBackend()
    base = space.baseline_params()
    run_search(_settings(tmp_path, 1), space, backend, study)
    study.enqueue_trial(base)
    run_search(dataclasses.replace(_settings(tmp_path, 1), **change), space, backend, study)
    assert len(backend.jobs) == 2  # the first result was measured under other settings: not reused
    assert "duplicate_of" not in study.trials[1].user_attrs

