"""The calibration set (512 samples of shipped text, disjoint from the evaluation text) and the plan a trial builds
from it: computed once per model, cached, and the fallback's layers chosen by the measured sensitivity."""
from __future__ import annotations

import json

import pytest
import torch

from autotune.config.calibration import DISJOINT_RUN, NUM_SAMPLES, SAMPLE_TOKENS, SENSITIVITY_SAMPLES, needs_plan
from autotune.config.deploy import DeployConfig
from autotune.engine import build_engine
from autotune.gate.corpus import EVAL_FILE
from autotune.quant import plan as plan_module
from autotune.quant.calib_set import calib_set_digest, calibration_samples, provenance, shared_run
from autotune.quant.plan import calibration_dir, quant_plan
from tests.plan_env import plan_env


@pytest.fixture(scope="module")
def tokenizer(smollm2_folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder)


def test_512_samples_of_shipped_text_disjoint_from_the_evaluation_text(tokenizer):
    samples = calibration_samples(tokenizer)
    assert len(samples) == NUM_SAMPLES == 512 and {len(s) for s in samples} == {SAMPLE_TOKENS}
    assert samples == calibration_samples(tokenizer)  # the same every time
    evaluation = tokenizer(EVAL_FILE.read_text(), add_special_tokens=False)["input_ids"]
    assert shared_run(samples, evaluation, DISJOINT_RUN) == []
    assert len({tuple(s) for s in samples}) == NUM_SAMPLES
    record = provenance(samples)
    assert record["samples"] == 512 and record["sample_tokens"] == SAMPLE_TOKENS
    assert EVAL_FILE.name not in record["files"] and record["set_digest"] == calib_set_digest()
    # What was drawn, not what is configured: another draw has another count and digest.
    fewer = provenance(samples[:100])
    assert fewer["samples"] == 100 and fewer["drawn_digest"] != record["drawn_digest"]


def test_the_disjointness_check_finds_a_shared_run():
    other = list(range(100))
    assert shared_run([[7, 8, 9] + list(range(40, 56)), [1] * 19], other, 16) == [0]


@pytest.fixture()
def tiny_plan_env(tiny_model_folder, tmp_path, monkeypatch):
    return plan_env(tiny_model_folder, tmp_path, monkeypatch)


@pytest.mark.slow
def test_round_to_nearest_with_fallback_ranks_layers_without_the_calibration_pass(tiny_plan_env, monkeypatch):
    spec, tokenizer, hf, _ = tiny_plan_env
    monkeypatch.setattr(plan_module, "collect_statistics", lambda *a, **k: pytest.fail("rtn needs no statistics"))
    plan = quant_plan(hf, spec, tokenizer, DeployConfig(quant="w8a16", fallback_layers=2))
    folder = calibration_dir(spec)
    assert not (folder / "calibration.pt").exists()
    ranking = json.loads((folder / "sensitivity-w8a16-rtn.json").read_text())["ranking"]
    assert list(plan.keep) == [name for name, _ in ranking[:2]]
    # The rtn build drew only the sensitivity's subset of the 128 samples the fixture gives it.
    assert plan.summary["calibration"]["samples"] == SENSITIVITY_SAMPLES
    assert plan.summary["calibration"]["used_for"] == "sensitivity"
    engine = build_engine(hf, DeployConfig(quant="w8a16", fallback_layers=2), plan=plan)
    assert engine.quantization["kept"] == sorted(plan.keep)


@pytest.mark.slow
def test_the_plan_is_measured_once_cached_and_keeps_the_most_sensitive_layers(tiny_plan_env, monkeypatch):
    spec, tokenizer, hf, drawn = tiny_plan_env
    assert quant_plan(hf, spec, tokenizer, DeployConfig(quant="w8a8")) is None  # rtn, no fallback: the plain scheme
    config = DeployConfig(quant="w8a8", quant_method="smoothquant_static", fallback_layers=2)
    assert needs_plan(config)
    plan = quant_plan(hf, spec, tokenizer, config)
    folder = calibration_dir(spec)
    assert (folder / "calibration.pt").is_file()
    ranking = json.loads((folder / "sensitivity-w8a8-smoothquant_static.json").read_text())["ranking"]
    assert list(plan.keep) == [name for name, _ in ranking[:2]]
    assert plan.summary["kept_layers"] == list(plan.keep)
    assert plan.summary["sensitivity"]["ranking"][0][0] == plan.keep[0]
    assert plan.summary["calibration"]["samples"] == 128  # what the fixture drew, not the configured 512
    assert len(drawn) == 1  # the calibration pass and the sensitivity read one set of samples, drawn once
    # The second trial reads the cache: no calibration pass, no sensitivity pass.
    monkeypatch.setattr(plan_module, "collect_statistics", lambda *a, **k: pytest.fail("calibrated twice"))
    monkeypatch.setattr(plan_module, "measure_sensitivity", lambda *a, **k: pytest.fail("measured twice"))
    again = quant_plan(hf, spec, tokenizer, config)
    assert again.keep == plan.keep
    # Another process (a later trial, another worker) reads the same from disk.
    monkeypatch.setattr(plan_module, "_LOADED", {})
    monkeypatch.setattr(plan_module, "_SAMPLES", {})
    from_disk = quant_plan(hf, spec, tokenizer, config)
    assert from_disk.keep == plan.keep and len(drawn) == 1
    assert all(torch.equal(from_disk.awq_scales[n], plan.awq_scales[n]) for n in plan.awq_scales)
    assert all(torch.equal(again.act_absmax[n], plan.act_absmax[n]) for n in plan.act_absmax)
    engine = build_engine(hf, config, plan=again)
    assert engine.quantization["converted"] == engine.quantization["decoder_linear_layers"] - 2
    assert engine.quantization["kept"] == sorted(plan.keep)
    # A recipe's own list of kept layers is used as given (serving it builds exactly what it says).
    given = quant_plan(hf, spec, tokenizer, config, keep=("layers.0.o_proj", "layers.1.o_proj"))
    assert given.keep == ("layers.0.o_proj", "layers.1.o_proj")
