"""The gate's verdicts with their intervals, and the decode check that grows its sample until its verdict is
decided: a pass is stated with a Clopper-Pearson interval above the threshold, a straddling one gets more prompts up
to the cap and then says it was decided by the point estimate, a certain fail stops at once, and a gate without a
decode result never passes."""
from __future__ import annotations

import math

import pytest
import torch

from autotune.config.deploy import DeployConfig
from autotune.engine import build_engine
from autotune.gate.decode import decode_check
from autotune.gate.reference import compute_reference
from autotune.gate.result import GateResult
from autotune.gate.verdict import design_effect, evidence, interval, judge


def test_the_interval_is_clopper_pearson():
    # 3 misses in 1,024 (a bf16 build under the old decode check): [0.991, 0.9994], as computed from the beta
    # quantiles; no misses in n: the lower bound is (alpha/2)^(1/n).
    low, high = interval(1021, 1024)
    assert low == pytest.approx(0.99146, abs=1e-5) and high == pytest.approx(0.99940, abs=1e-5)
    assert interval(16, 16) == (pytest.approx(0.025 ** (1 / 16)), 1.0)
    assert interval(0, 10)[0] == 0.0


def test_the_sequential_test_decides_at_its_bounds_and_leaves_the_rest_marginal():
    """Between 0.994 (fail point) and 0.997 (pass point) at threshold 0.995: each miss weighs ln(0.5), each
    agreement ln(0.997/0.994); a pass needs ln(16), a fail ln(0.2/0.95)."""
    decided_pass = judge(1534, 1536, 0.995, cap_positions=6144)  # 2 misses in one stage of 48 prompts
    assert decided_pass.passed and decided_pass.decided and "pass:" in decided_pass.reason
    assert judge(1531, 1536, 0.995, cap_positions=6144) is None  # 5 misses: undecided, the sample grows
    decided_fail = judge(1527, 1536, 0.995, cap_positions=6144)  # 9 misses: the fail bound
    assert not decided_fail.passed and decided_fail.decided and decided_fail.low < 0.995 < decided_fail.high
    # 26 misses of 6,144 (0.99577, above the threshold): still undecided at the cap, so marginal, not a pass.
    at_cap = judge(6118, 6144, 0.995, cap_positions=6144)
    assert not at_cap.passed and at_cap.marginal and "marginal" in at_cap.reason and at_cap.low < 0.995
    assert judge(6125, 6144, 0.995, cap_positions=6144).passed  # 19 misses: a pass at the last look
    assert evidence(1536, 1536, 0.995) == pytest.approx(1536 * math.log(0.997 / 0.994))
    assert evidence(1535, 1536, 0.995) - evidence(1536, 1536, 0.995) == pytest.approx(
        math.log(0.5) - math.log(0.997 / 0.994))


def test_the_prompt_is_the_unit_misses_that_cluster_in_one_prompt_weigh_less():
    """Four misses in four prompts are four events; four in one prompt are nearer one: the design effect is the
    per-prompt variance over the binomial's, so the same totals give weaker evidence and a wider interval."""
    spread = [1, 1, 1, 1] + [0] * 44
    clumped = [4] + [0] * 47
    assert float(design_effect(spread, 32)) == 1.0  # as even as independent positions (clamped at 1)
    effect = float(design_effect(clumped, 32))
    mean, rate = 4 / 48, 4 / 1536
    variance = ((4 - mean) ** 2 + 47 * mean ** 2) / 47
    assert effect == pytest.approx(variance / (32 * rate * (1 - rate))) and effect == pytest.approx(4.01, abs=0.01)
    assert float(design_effect([32, 0, 0, 0], 32)) == 32  # all or nothing: one prompt is one event
    assert float(design_effect([0] * 48, 32)) == 1.0 and float(design_effect([3], 32)) == 1.0
    # The same 4 misses of 1,536: spread over prompts, undecided (the sample grows); clumped, the effective
    # sample is a third as large and the interval is wider.
    assert judge(1532, 1536, 0.995, cap_positions=6144, effect=1.0) is None
    clumped_verdict = judge(1532, 1536, 0.995, cap_positions=1536, effect=effect)
    low, high = clumped_verdict.low, clumped_verdict.high
    assert clumped_verdict.marginal and "design effect 4.01" in clumped_verdict.reason
    assert (low, high) == pytest.approx(interval(1532 / effect, 1536 / effect))
    assert low < interval(1532, 1536)[0]
    assert evidence(1532, 1536, 0.995, effect) == pytest.approx(evidence(1532, 1536, 0.995) / effect)


def test_a_loose_threshold_is_decided_by_what_a_small_sample_can_show():
    """Below 1 - 1/1.2 the fail point's miss rate would pass 1: it is held below, and one agreeing position then
    decides a pass; a threshold of 1 can never be exceeded."""
    assert judge(1, 1, 0.0, cap_positions=48).passed
    assert judge(48, 48, 0.9, cap_positions=48).passed  # 48 of 48: ln(0.94/0.88) each, past ln(16)
    assert not judge(48, 48, 1.0, cap_positions=48).passed


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
    # Against 0.995, no sample this small is conclusive: every prompt is used, and the build is marginal, which
    # is not a pass (however high its point estimate).
    strict = _check(tiny_llama, engine, 0.995)
    assert strict["decode_prompts"] == 6 and strict["decode_positions"] == 48 and not strict["decode_decided"]
    assert not strict["decode_passed"] and "marginal" in strict["decode_verdict"]
    assert strict["decode_agreement"] == 1.0


def test_a_broken_decode_path_fails_at_the_first_stage(tiny_llama):
    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, dtype="fp32"))
    for segment in engine.model.segments:  # a broken decode graph; prefill untouched
        segment.decode = lambda x, step, k, v, run=segment.decode: run(x, step, k, v) * 0.0
    broken = _check(tiny_llama, engine, 0.995)
    assert broken["decode_prompts"] == 2 and broken["decode_decided"] and not broken["decode_passed"]
    assert broken["decode_agreement"] < 0.5 and broken["decode_first_miss"] is not None
