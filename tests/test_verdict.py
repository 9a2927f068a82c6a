"""The gate's verdicts with their intervals, and the decode check that grows its sample until its verdict is
decided: a pass is stated with a Clopper-Pearson interval above the threshold, a straddling one gets more prompts up
to the cap and then says it was decided by the point estimate, a certain fail stops at once, and a gate without a
decode result never passes."""
from __future__ import annotations

import pytest
import torch

from autotune.config.deploy import DeployConfig
from autotune.engine import build_engine
from autotune.gate.decode import decode_check
from autotune.gate.reference import compute_reference
from autotune.gate.result import GateResult
from autotune.gate.verdict import interval, judge


def test_the_interval_is_clopper_pearson():
    # 3 misses in 1,024 (a bf16 build under the old decode check): [0.991, 0.9994], as computed from the beta
    # quantiles; no misses in n: the lower bound is (alpha/2)^(1/n).
    low, high = interval(1021, 1024)
    assert low == pytest.approx(0.99146, abs=1e-5) and high == pytest.approx(0.99940, abs=1e-5)
    assert interval(16, 16) == (pytest.approx(0.025 ** (1 / 16)), 1.0)
    assert interval(0, 10)[0] == 0.0


def test_a_verdict_is_decided_only_where_its_interval_is_on_one_side():
    decided_pass = judge(1534, 1536, 0.995, cap_positions=6144)  # 2 misses in one stage of 48 prompts
    assert decided_pass.passed and decided_pass.decided and decided_pass.low > 0.995
    assert judge(1531, 1536, 0.995, cap_positions=6144) is None  # 5 misses: straddles, the sample grows
    at_cap = judge(6118, 6144, 0.995, cap_positions=6144)
    assert at_cap.passed and not at_cap.decided and "point estimate" in at_cap.reason and at_cap.low < 0.995
    decided_fail = judge(1500, 1536, 0.995, cap_positions=6144)
    assert not decided_fail.passed and decided_fail.decided and decided_fail.high <= 0.995
    # More misses than a pass over the whole cap allows (31 of 6,144 is 0.99495): certain, though the interval of
    # what was scored still straddles the threshold.
    certain = judge(5969, 6000, 0.995, cap_positions=6144)
    assert certain is not None and not certain.passed and certain.decided and "more than a pass" in certain.reason


def test_a_gate_without_a_decode_result_never_passes():
    windows = dict(tie_aware_agreement=1.0, raw_agreement=1.0, perplexity=2.0, reference_perplexity=2.0,
                   kl_divergence=0.0, positions=5110, tie_epsilon=0.05, min_agreement=0.995)
    gate = GateResult(**windows)
    assert gate.windows_passed and not gate.passed and "no result" in gate.fail_reason()
    assert not GateResult.from_dict(gate.to_dict()).passed
    assert GateResult(**windows, decode_agreement=1.0, decode_passed=True).passed


def _check(tiny_llama, engine, min_agreement: float) -> dict:
    g = torch.Generator().manual_seed(11)
    vocab = tiny_llama.config.vocab_size
    windows = [torch.randint(3, vocab, (32,), generator=g).tolist()]
    prompts = [torch.randint(3, vocab, (10,), generator=g).tolist() for _ in range(6)]
    ref = compute_reference(tiny_llama, windows, prompts, new_tokens=9)  # 8 scored decode steps a prompt
    return decode_check(engine, ref, prompts, 0.05, min_agreement, max_seq_len=0, pool_tokens=None, stage=2)


def test_the_decode_check_grows_its_sample_until_the_verdict_is_decided(tiny_llama):
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, dtype="fp32"))
    # 16 of 16 agree after one stage: above 0.5 with 95% confidence, decided there.
    easy = _check(tiny_llama, engine, 0.5)
    assert easy["decode_prompts"] == 2 and easy["decode_positions"] == 16 and easy["decode_decided"]
    assert easy["decode_passed"] and easy["decode_interval"][0] > 0.5
    # Against 0.995, no sample this small is conclusive: every prompt is used, then the point estimate decides.
    strict = _check(tiny_llama, engine, 0.995)
    assert strict["decode_prompts"] == 6 and strict["decode_positions"] == 48 and not strict["decode_decided"]
    assert strict["decode_passed"] and "straddles" in strict["decode_verdict"]


def test_a_broken_decode_path_fails_at_the_first_stage(tiny_llama):
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, dtype="fp32"))
    for segment in engine.model.segments:  # a broken decode graph; prefill untouched
        segment.decode = lambda x, step, k, v, run=segment.decode: run(x, step, k, v) * 0.0
    broken = _check(tiny_llama, engine, 0.995)
    assert broken["decode_prompts"] == 2 and broken["decode_decided"] and not broken["decode_passed"]
    assert broken["decode_agreement"] < 0.5 and broken["decode_first_miss"] is not None
