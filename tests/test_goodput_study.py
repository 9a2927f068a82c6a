"""A study under latency objectives (`--slo`): goodput and peak memory are its objectives, stored on it; every trial
is asked for its goodput under the SLO; the front and the table show it; it resumes only under the same SLO."""
from __future__ import annotations

import dataclasses

import pytest

from autotune.config.deploy import DeployConfig
from autotune.config.slo import Slo
from autotune.errors import UserInputError
from autotune.results.tables import pareto_table
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.study.loop import run_search
from autotune.study.settings import GOODPUT_OBJECTIVES, OBJECTIVES, SearchSettings, study_objectives
from autotune.study.setup import enqueue_baseline, open_study
from autotune.trial.job import JobResult, Status
from tests.test_study import ScriptedBackend

SLO = Slo(1000.0, 100.0, 0.9)


class GoodputBackend(ScriptedBackend):
    """The scripted backend's trials, with a goodput under the job's SLO: a batch of 4 serves the most (a bigger one
    makes each request's TPOT too long, a smaller one queues)."""

    def run(self, job, timeout_s):
        result = super().run(job, timeout_s)
        if result.status is Status.OK and job.slo is not None:
            batch = DeployConfig.from_dict(job.config).batch_size
            rate = 4.0 - abs(batch - 4) * 0.5
            rates = [{"rate": rate, "attainment": 0.95, "counted": 36}, {"rate": rate * 1.1, "attainment": 0.5,
                                                                           "counted": 36}]
            result.goodput = {"met": True, "goodput_req_s": rate, "goodput_tok_s": rate * 48, "rates": rates,
                              "slo": job.slo}
            result.bench = {**result.bench, "goodput_req_s": rate, "goodput_tok_s": rate * 48}
        return result


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_CACHE", str(tmp_path / "cache"))


def _settings(tmp_path, trials: int, slo: Slo | None = SLO) -> SearchSettings:
    return SearchSettings(model="m", study="g", storage=f"sqlite:///{tmp_path}/g.db", trials=trials, slo=slo,
                          sampler="random", seed=0)


def _open(settings: SearchSettings):
    study = open_study(settings)
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    enqueue_baseline(study, load_space(DEFAULT_SPACE))
    return study


def test_goodput_and_memory_are_the_objectives_and_every_trial_is_asked_for_goodput(tmp_path):
    backend = GoodputBackend()
    study = _open(_settings(tmp_path, 6))
    assert study_objectives(study) == GOODPUT_OBJECTIVES and len(study.directions) == 2
    assert study.metric_names == ["goodput_req_s", "peak_memory_mb"] and study.user_attrs["slo"] == SLO.to_dict()
    run_search(_settings(tmp_path, 6), load_space(DEFAULT_SPACE), backend, study)
    assert backend.jobs and all(j.slo == SLO.to_dict() and j.front == [] for j in backend.jobs)
    done = [t for t in study.trials if t.values]
    assert done and all(t.values == [t.user_attrs["bench"]["goodput_req_s"], t.user_attrs["bench"]["peak_memory_mb"]]
                        for t in done)
    assert all(t.user_attrs["goodput"]["rates"] for t in done)  # every rate tried, kept on the trial
    table = pareto_table(study)
    assert "goodput" in table.splitlines()[0] and "r/s" in table and "TTFT 1000 ms and TPOT 100 ms" in table


def test_a_goodput_study_resumes_only_under_the_same_slo(tmp_path):
    backend = GoodputBackend()
    study = _open(_settings(tmp_path, 2))
    run_search(_settings(tmp_path, 2), load_space(DEFAULT_SPACE), backend, study)
    before = len([t for t in study.trials if t.values])
    for other in (dataclasses.replace(SLO, ttft_ms=500.0), dataclasses.replace(SLO, attainment=0.99), None):
        with pytest.raises(UserInputError, match="pick another --study|same --slo"):
            open_study(_settings(tmp_path, 2, other))
    again = open_study(_settings(tmp_path, 4))
    run_search(_settings(tmp_path, 4), load_space(DEFAULT_SPACE), backend, again)
    assert len([t for t in again.trials if t.values]) > before  # resumed: the old trials kept, new ones added


def test_a_throughput_study_keeps_its_three_objectives(tmp_path):
    study = _open(_settings(tmp_path, 1, None))
    assert study_objectives(study) == OBJECTIVES and study.user_attrs["slo"] is None
    with pytest.raises(UserInputError):
        open_study(_settings(tmp_path, 1))  # the same study under an SLO: other objectives


def test_a_runtime_without_a_step_runner_says_goodput_was_not_measured():
    from autotune.trial.job import Job, JobKind
    from autotune.trial.pipeline import run_trial

    class Stages:  # a runtime's stages without goodput (llama.cpp's)
        device, versions, checksum = "cpu", None, "sha256:x"

        def build(self):
            return JobResult(Status.OK, build_s=1.0)

        def gate(self, cached):
            return {"passed": True, "tie_aware_agreement": 1.0, "raw_agreement": 1.0, "perplexity": 1.0}

        def bench(self):
            return {"throughput_tok_s": 10.0}

        def timing(self):
            return {}

        def close(self):
            pass

    job = Job(kind=JobKind.TRIAL, model="m", workload={}, slo=SLO.to_dict(), gate={"cached": True})
    result = run_trial(job, Stages(), lambda partial: None)
    assert result.bench["goodput_req_s"] == 0.0 and "not measured" in result.goodput["note"]


def test_an_slo_no_configuration_meets_is_said_in_one_line(tmp_path, capsys):
    from autotune.api.run import _say_if_unmet

    class Unmet(GoodputBackend):
        def run(self, job, timeout_s):
            result = super().run(job, timeout_s)
            if result.goodput:
                rates = [{"rate": 2.0, "attainment": 0.4, "counted": 36}, {"rate": 1.0, "attainment": 0.7,
                                                                           "counted": 36}]
                result.goodput = {**result.goodput, "met": False, "goodput_req_s": 0.0, "rates": rates}
                result.bench = {**result.bench, "goodput_req_s": 0.0}
            return result

    study = _open(_settings(tmp_path, 2))
    run_search(_settings(tmp_path, 2), load_space(DEFAULT_SPACE), Unmet(), study)
    capsys.readouterr()
    _say_if_unmet(study, SLO)
    lines = [line for line in capsys.readouterr().err.splitlines() if "no configuration met the SLO" in line]
    assert len(lines) == 1 and "best attainment seen was 70%" in lines[0] and "at 1 req/s" in lines[0]


@pytest.mark.slow
def test_an_unguided_slo_study_whose_sampler_picks_do_not_fit_gets_a_fitting_pick(tmp_path, tiny_model_folder,
                                                                                       monkeypatch):
    """With --no-guide the sampler picks every trial; where its picks keep ending past the time left, the guide's
    cost model queues one that fits rather than the search ending with its budget unspent."""
    import time

    import autotune.study.loop as loop

    class CpuGoodput(GoodputBackend):
        name = "cpu"  # the backend the guide has a profile for

    def cost_model(study, settings, guide):
        # Only plain eager builds fit; a random pick is one of them about one time in twelve.
        return lambda c: 5.0 if c.fusion_level == "O0" and c.quant == "none" else 1e6

    monkeypatch.setattr(loop, "_cost_model", cost_model)
    space = load_space(DEFAULT_SPACE).restrict("dtype", ("fp32",), "every CPU computes fp32").restrict(
        "device_power", (1, 2), "2 cores")
    settings = dataclasses.replace(_settings(tmp_path, 6), model=str(tiny_model_folder), timeout_s=3600.0,
                                   deadline=time.time() + 3600.0, guided=False)
    study = open_study(settings)
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    enqueue_baseline(study, space)
    run_search(settings, space, CpuGoodput(), study)
    assert study.user_attrs["stopped_by"]["rule"] == "trials"  # not "the sampler's last 3 picks ..."
    ran = [t for t in study.trials if "config" in t.user_attrs and not t.user_attrs.get("not_run")]
    guided = [t for t in ran if t.user_attrs.get("role") == "sim-guided"]
    assert guided and all(DeployConfig.from_dict(t.user_attrs["config"]).fusion_level == "O0" for t in guided)


@pytest.mark.slow
def test_a_guided_slo_study_orders_its_trials_by_predicted_goodput(tmp_path, tiny_model_folder):
    """Under an SLO the guide picks trials too, each with the goodput the simulated server predicts for it."""
    class CpuGoodput(GoodputBackend):
        name = "cpu"  # the backend the guide has a profile for

    space = load_space(DEFAULT_SPACE).restrict("dtype", ("fp32",), "every CPU computes fp32").restrict(
        "device_power", (1, 2), "2 cores")
    settings = dataclasses.replace(_settings(tmp_path, 5), model=str(tiny_model_folder))
    study = open_study(settings)
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    enqueue_baseline(study, space)
    run_search(settings, space, CpuGoodput(), study)
    guided = [t for t in study.trials if t.user_attrs.get("role") == "sim-guided"]
    assert guided and all(t.user_attrs["predicted"]["goodput_req_s"] >= 0 for t in guided)
    assert all("prefill_chunk" in t.user_attrs["config"] for t in guided)
