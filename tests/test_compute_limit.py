"""How close a configuration runs to the machine's arithmetic ceiling: the figure, what it is read against, and
where a user sees it (the results table, the recipe)."""
from __future__ import annotations

import optuna
import pytest

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.recipes.compute_limit import trial_compute_limit
from autotune.recipes.recipe import build_recipe
from autotune.results.tables import pareto_table
from autotune.sim.cost import linear_params_per_layer
from autotune.sim.limit import compute_limit, flops_per_output_token
from autotune.study.settings import OBJECTIVES

SMOL = resolve_model("smollm2-135m")
RATES = {"bf16": {"1": 20.0, "8": 100.0, "16": 150.0, "64": 200.0}, "fp32": {"8": 60.0}}


def test_the_flops_are_a_decode_steps_per_token():
    config = DeployConfig(quant="none", dtype="bf16", batch_size=16)
    flops = flops_per_output_token(SMOL, config, Workload())
    matmuls = 2 * SMOL.num_layers * linear_params_per_layer(SMOL) + 2 * SMOL.hidden_size * SMOL.vocab_size
    assert matmuls < flops < 1.2 * matmuls  # attention over a ~160-token context adds a little


def test_the_fraction_is_the_achieved_rate_over_the_probed_rate_at_that_batch_times_the_threads():
    config = DeployConfig(quant="none", dtype="bf16", batch_size=16)
    limit = compute_limit(SMOL, config, Workload(), 200.0, RATES, 2)
    achieved = flops_per_output_token(SMOL, config, Workload()) * 200.0 / 1e9
    assert limit["ceiling_gflops"] == 300.0  # 150 GFLOP/s a thread at 16 rows, 2 threads
    assert limit["achieved_gflops"] == pytest.approx(achieved, abs=0.01)
    assert limit["fraction"] == pytest.approx(achieved / 300.0, abs=1e-3)
    # Batch 32 was not probed: the largest probed row count below it is read.
    at_32 = compute_limit(SMOL, DeployConfig(quant="none", dtype="bf16", batch_size=32), Workload(), 200.0, RATES, 2)
    assert at_32["ceiling_gflops"] == 300.0 and "at 16 rows" in at_32["how"]
    assert compute_limit(SMOL, DeployConfig(quant="none", dtype="fp16"), Workload(), 200.0, RATES, 2) is None


def _study_with_one_trial(rates: dict | None) -> optuna.Study:
    study = optuna.create_study(directions=[d for _, d in OBJECTIVES])
    attrs = {"model": "smollm2-135m", "model_source": "test", "model_checksum": "sha256:x", "backend": "cpu",
             "hardware": {"hardware": "cpu-test-zen4-avx512bf16-2c"}, "workload": Workload().to_dict(),
             "capabilities": {"figures": {"rate_gflops": rates}} if rates else {}}
    for key, value in attrs.items():
        study.set_user_attr(key, value)
    config = DeployConfig(quant="none", dtype="bf16", batch_size=16)
    bench = {"throughput_tok_s": 200.0, "tpot_p50_ms": 50.0, "tpot_p99_ms": 60.0, "ttft_p50_ms": 300.0,
             "ttft_p99_ms": 400.0, "peak_memory_mb": 700.0, "repeats": 3}
    study.add_trial(optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE, values=[200.0, 60.0, 700.0],
        user_attrs={"bench": bench, "config": config.to_dict(), "threads": 2, "gate": {"passed": True,
                    "tie_aware_agreement": 0.999}}))
    return study


def test_the_table_and_the_recipe_carry_the_fraction():
    study = _study_with_one_trial(RATES)
    trial = study.trials[0]
    expected = trial_compute_limit(study.user_attrs, trial.user_attrs)
    assert expected is not None and 0 < expected["fraction"] < 1
    table = pareto_table(study)
    assert " limit" in table.splitlines()[0] and f"{expected['fraction']:.2f}" in table.splitlines()[2]
    assert "arithmetic ceiling" in table
    recipe = build_recipe(study, trial, "sqlite://", ["best-throughput"])
    assert recipe["metrics"]["compute_limit"] == expected


def test_a_study_without_probed_rates_shows_no_fraction():
    study = _study_with_one_trial(None)
    assert trial_compute_limit(study.user_attrs, study.trials[0].user_attrs) is None
    assert "compute_limit" not in build_recipe(study, study.trials[0], "sqlite://", [])["metrics"]
