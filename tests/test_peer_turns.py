"""The guide's turns for a runtime its simulator does not model (study/peer_turns.py): one knob away from that
runtime's best measured configuration, speed knobs before numerics, never tried twice, never numerics that failed."""
from __future__ import annotations

import pytest

from autotune.config.deploy import DeployConfig
from autotune.study.peer_turns import next_peer_params, peer_runtimes
from tests.runtime_spaces import add_trial, three_objective_study, two_runtime_space


@pytest.fixture
def space(tmp_path):
    return two_runtime_space(tmp_path, "bf16")


def _add(study, space, params: dict, tok_s: float | None, passed: bool = True) -> None:
    add_trial(study, space, params, {"passed": passed}, {"throughput_tok_s": tok_s} if tok_s and passed else None)


BEST = {"runtime": "openvino", "batch_size": 16, "device_power": 2, "weight_format": "fp16",
        "inference_precision": "bf16", "kv_precision": "u8", "max_num_batched_tokens": 256}


def test_a_speed_knob_of_the_best_first_then_another_once_it_is_tried(space):
    study = three_objective_study()
    assert peer_runtimes(study, space) == [] and next_peer_params(study, space, "openvino") is None
    _add(study, space, {"runtime": "engine", "dtype": "fp32", "quant": "none", "fusion_level": "O0", "batch_size": 8,
                        "page_size": 16, "kv_policy": "on_demand", "device_power": 2}, 100.0)
    _add(study, space, BEST, 300.0)
    _add(study, space, {**BEST, "max_num_batched_tokens": 2048, "batch_size": 8}, 250.0)
    assert peer_runtimes(study, space) == ["openvino"]  # the engine's turns are the simulator's
    best = space.to_config(BEST)
    first = next_peer_params(study, space, "openvino")
    changed = {k for k in BEST if first.get(k) != BEST[k]}
    assert changed == {"batch_size"} and space.to_config(first).numerics_key() == best.numerics_key()
    _add(study, space, first, 280.0)
    second = next_peer_params(study, space, "openvino")
    assert {k for k in BEST if second.get(k) != BEST[k]} == {"max_num_batched_tokens"}


def test_numerics_that_failed_the_gate_are_never_proposed(space):
    study = three_objective_study()
    _add(study, space, BEST, 300.0)
    _add(study, space, {**BEST, "weight_format": "int8"}, None, passed=False)
    best_key = space.to_config(BEST).numerics_key()
    # Only numerics changes allowed: int8 failed here, so the KV cache's precision is what is left to try.
    picked = next_peer_params(study, space, "openvino", fits=lambda c: c.numerics_key() != best_key)
    assert isinstance(space.to_config(picked), DeployConfig)
    assert picked["weight_format"] == "fp16" and picked["kv_precision"] == "bf16"
    _add(study, space, picked, None, passed=False)
    assert next_peer_params(study, space, "openvino", fits=lambda c: c.numerics_key() != best_key) is None
