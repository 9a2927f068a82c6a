"""The simulator-guided order of trials: what the guide proposes after measured trials, what it leaves out after
a failed gate, and that run_search mixes its trials with the sampler's."""
from __future__ import annotations

import optuna
import pytest
from test_study import ScriptedBackend

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.space.search_space import DEFAULT_SPACE, load_space
from autotune.study.guide import GUIDE_ROLE, Guide
from autotune.study.loop import run_search
from autotune.study.settings import OBJECTIVES, SearchSettings, make_sampler
from autotune.study.setup import enqueue_baseline
from autotune.trial.job import JobResult, Status

# fp32: what every CPU computes natively, so that cpu-local (this machine's probe) predicts every point.
SPACE = load_space(DEFAULT_SPACE).restrict("device_power", (1, 2), "this test's machine has 2 cores").restrict(
    "dtype", ("fp32",), "every CPU computes fp32")
PASS = {"tie_aware_agreement": 0.999, "raw_agreement": 0.97, "passed": True, "min_agreement": 0.995}
FAIL_EARLY = {"tie_aware_agreement": 0.90, "raw_agreement": 0.85, "passed": False, "min_agreement": 0.995,
              "stopped_early": True}


def _told(study: optuna.Study, params: dict, gate: dict, bench: dict | None) -> None:
    study.enqueue_trial(params)
    trial = study.ask()
    SPACE.suggest(trial)
    trial.set_user_attr("config", DeployConfig.from_params(params).to_dict())
    trial.set_user_attr("gate", gate)
    if bench is None:
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        return
    trial.set_user_attr("bench", bench)
    study.tell(trial, [bench["throughput_tok_s"], bench["tpot_p99_ms"], bench["peak_memory_mb"]])


def _bench(tput: float) -> dict:
    return {"throughput_tok_s": tput, "tpot_p50_ms": 40.0, "tpot_p99_ms": 45.0, "ttft_p50_ms": 2000.0,
            "peak_memory_mb": 600.0}


def _study() -> optuna.Study:
    return optuna.create_study(directions=[d for _, d in OBJECTIVES])


@pytest.mark.slow
def test_speed_turns_exploit_schemes_known_to_pass_and_refit_on_what_was_measured(tiny_model_folder):
    guide = Guide.for_backend("cpu", str(tiny_model_folder), SPACE, Workload())
    assert guide is not None
    study = _study()
    _told(study, SPACE.baseline_params(), PASS, _bench(150.0))
    prior = guide.profile.factors
    params, predicted = guide.next_params(study, turn=0)  # a throughput turn
    assert guide.fitted_on == 1 and guide.profile.factors != prior  # refitted on the measured baseline
    assert params["quant"] == "none" and params != SPACE.baseline_params()
    # It is the predicted best of the untried bf16 configurations.
    best = max((p for p in SPACE.grid() if p["quant"] == "none" and p != SPACE.baseline_params()),
               key=lambda p: guide_predict(guide, p))
    assert abs(predicted["throughput_tok_s"] - guide_predict(guide, best)) < 1e-6 * max(1.0, guide_predict(guide, best))


def guide_predict(guide: Guide, params: dict) -> float:
    from autotune.sim.predict import predict

    return round(predict(guide.spec, DeployConfig.from_params(params), guide.workload, guide.profile)
                 .throughput_tok_s, 2)


@pytest.mark.slow
def test_an_unknown_scheme_is_probed_eagerly_and_a_failed_scheme_is_left_out(tiny_model_folder):
    guide = Guide.for_backend("cpu", str(tiny_model_folder), SPACE, Workload())
    study = _study()
    # Nothing is known yet: whatever the turn, a scheme is first tried at O0 (no compile to pay for the lesson).
    picks = [guide.next_params(study, turn)[0] for turn in range(4)]
    assert all(p["fusion_level"] == "O0" and "layers_per_subgraph" not in p for p in picks)
    _told(study, {**SPACE.baseline_params(), "quant": "w8a8"}, FAIL_EARLY, None)
    _told(study, SPACE.baseline_params(), PASS, _bench(150.0))
    for turn in range(8):
        picked, _ = guide.next_params(study, turn)
        assert picked["quant"] != "w8a8"
        if turn % 4 != 3:  # speed turns take only what is known to pass
            assert picked["quant"] == "none"


class _Scripted(ScriptedBackend):
    """A measured backend named like the CPU's, so that the guide takes it for one; figures are scripted."""

    name = "cpu"

    def run(self, job, timeout_s):
        config = DeployConfig.from_dict(job.config)
        return JobResult(Status.OK, gate=PASS, bench=_bench(100.0 + config.batch_size))


@pytest.mark.slow
def test_run_search_mixes_guided_trials_with_the_samplers(tmp_path, tiny_model_folder):
    url = f"sqlite:///{tmp_path}/g.db"
    study = optuna.create_study(study_name="g", storage=url, directions=[d for _, d in OBJECTIVES],
                                sampler=make_sampler("random", 0))
    study.set_user_attr("model_checksum", "sha256:x")
    study.set_user_attr("eval_digest", "d")
    settings = SearchSettings(model=str(tiny_model_folder), study="g", storage=url, trials=7, sampler_share=3)
    enqueue_baseline(study, SPACE)  # as the set-up does
    run_search(settings, SPACE, _Scripted(), study)
    roles = [t.user_attrs.get("role") for t in study.trials]
    assert roles[0] == "baseline"
    # After the baseline: two guided, one the sampler's, and so on.
    assert roles[1:] == [GUIDE_ROLE, None, GUIDE_ROLE, GUIDE_ROLE, None, GUIDE_ROLE]
    assert all("predicted" in t.user_attrs for t in study.trials if t.user_attrs.get("role") == GUIDE_ROLE)
    assert len({tuple(sorted(t.params.items())) for t in study.trials}) == len(study.trials)  # none repeated
