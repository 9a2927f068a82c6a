"""The guide over several runtimes (study/guide.py, sim/stand_in.py): each runtime's configurations predicted with a
profile fitted to its own trials alone, none before one of its trials is measured, one front across runtimes, and
the numerics a runtime failed on left out of its picks."""
from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.sim.hardware import load_profile
from autotune.sim.predict import predict
from autotune.sim.stand_in import stand_in
from autotune.study.guide import Guide
from tests.runtime_spaces import add_trial, three_objective_study, two_runtime_space

ENGINE_BASE = {"runtime": "engine", "dtype": "fp32", "quant": "none", "fusion_level": "O0", "batch_size": 8,
               "page_size": 16, "kv_policy": "on_demand", "device_power": 2}
OV_BASE = {"runtime": "openvino", "batch_size": 16, "device_power": 2, "weight_format": "fp16",
           "inference_precision": "f32", "kv_precision": "u8", "max_num_batched_tokens": 256}
PASS = {"tie_aware_agreement": 0.999, "passed": True}
FAIL = {"tie_aware_agreement": 0.95, "passed": False}


@pytest.fixture
def space(tmp_path):
    return two_runtime_space(tmp_path, "f32")


@pytest.fixture
def guide(space):
    # A fixed profile (no probe of this machine): what is tested is which trials fit which runtime's factors.
    profile = replace(load_profile("a100-80g"), power_levels={}, power_kind="none")
    return Guide(resolve_model("smollm2-135m"), space, Workload(), profile)


def _bench(tok_s: float, tpot_ms: float) -> dict:
    return {"throughput_tok_s": tok_s, "tpot_p50_ms": tpot_ms, "tpot_p99_ms": tpot_ms * 1.1,
            "ttft_p50_ms": 900.0, "peak_memory_mb": 700.0}


def test_the_stand_in_is_the_engine_deployment_doing_the_runtime_s_arithmetic():
    engine = DeployConfig(dtype="fp32", batch_size=4)
    assert stand_in(engine) is engine
    ov = stand_in(DeployConfig(runtime="openvino", weight_format="int8", inference_precision="f32",
                               kv_precision="f32", batch_size=16, device_power=2))
    assert (ov.runtime, ov.quant, ov.dtype, ov.fusion_level, ov.layers_per_subgraph, ov.page_size,
            ov.batch_size, ov.device_power) == ("engine", "w8a16", "fp32", "O2", 0, 32, 16, 2)
    assert stand_in(DeployConfig(runtime="llamacpp", gguf_type="BF16")).dtype == "bf16"
    assert stand_in(DeployConfig(runtime="llamacpp", gguf_type="Q8_0")) is None  # no cost view of its kernels


def test_a_runtime_is_predicted_with_its_own_trials_once_one_is_measured(guide, space):
    study = three_objective_study()
    add_trial(study, space, ENGINE_BASE, PASS, _bench(100.0, 70.0))
    params, _ = guide.next_params(study, turn=0)
    assert params["runtime"] == "engine"  # no OpenVINO trial measured yet: nothing stands for its kernels
    assert set(guide.profiles) == {"engine"} and guide.fitted_on == 1

    engine_fit = guide.profile
    add_trial(study, space, OV_BASE, PASS, _bench(900.0, 15.0))
    params, predicted = guide.next_params(study, turn=0)  # a throughput turn
    assert guide.fitted_on == 2 and set(guide.profiles) == {"engine", "openvino"}
    assert guide.profile == engine_fit  # OpenVINO's trial did not move the engine's factors
    assert guide.profiles["openvino"].factors != engine_fit.factors
    # OpenVINO measured 9x the engine's eager figure: its untried configuration is predicted above the engine's.
    assert params["runtime"] == "openvino" and params != OV_BASE
    config = space.to_config(params)
    expected = predict(guide.spec, stand_in(config), guide.workload, guide.profiles["openvino"]).throughput_tok_s
    assert predicted["throughput_tok_s"] == pytest.approx(expected, abs=0.01)
    # The knobs the simulator does not see stay at their first values in a guided pick.
    assert (params["kv_precision"], params["max_num_batched_tokens"]) == ("u8", 256)


def test_a_runtime_s_failed_scheme_is_left_out_and_a_passing_variant_is_kept(guide, space):
    study = three_objective_study()
    add_trial(study, space, ENGINE_BASE, PASS, _bench(100.0, 70.0))
    # int8 weights failed in their default variant (u8 KV) and no variant passed: not proposed again.
    add_trial(study, space, {**OV_BASE, "weight_format": "int8"}, FAIL, None)
    # fp16 passed only with an f32 KV cache: guided fp16 picks carry it.
    add_trial(study, space, {**OV_BASE, "kv_precision": "f32"}, PASS, _bench(900.0, 15.0))
    seen = set()
    for turn in range(6):
        picked = guide.next_params(study, turn=turn)
        if picked is None:
            break
        params, predicted = picked
        if params["runtime"] == "openvino":
            assert params["weight_format"] == "fp16" and params["kv_precision"] == "f32"
            seen.add(params["batch_size"])
        add_trial(study, space, params, PASS, _bench(predicted["throughput_tok_s"], predicted["tpot_p99_ms"] / 1.1))
    assert seen == {8}  # the one fp16 OpenVINO configuration left untried


def test_a_doubted_trial_is_not_fitted(guide, space):
    study = three_objective_study()
    add_trial(study, space, ENGINE_BASE, PASS, {**_bench(10.0, 700.0), "doubt": "the machine was busy"})
    guide.refit(study.get_trials(deepcopy=False))
    assert guide.fitted_on == 0 and guide.profile == guide.prior
    add_trial(study, space, {**ENGINE_BASE, "batch_size": 16}, PASS, _bench(100.0, 70.0))
    guide.refit(study.get_trials(deepcopy=False))
    assert guide.fitted_on == 1
