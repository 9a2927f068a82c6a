"""The gate on a tiny model: the reference configuration agrees fully; damaged numerics fail it."""
from __future__ import annotations

import torch

from autotune.config.deploy import DeployConfig
from autotune.engine import build_engine
from autotune.gate.accuracy import compute_reference, evaluate_gate


def _windows(vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    g = torch.Generator().manual_seed(3)
    windows = [torch.randint(3, vocab, (64,), generator=g).tolist() for _ in range(3)]
    prompts = [torch.randint(3, vocab, (10,), generator=g).tolist() for _ in range(2)]
    return windows, prompts


def test_full_precision_engine_agrees_with_the_reference(sharp_llama):
    windows, prompts = _windows(sharp_llama.config.vocab_size)
    ref = compute_reference(sharp_llama, windows, prompts, drift_tokens=24)
    engine = build_engine(sharp_llama, DeployConfig(batch_size=2), dtype=torch.float32)
    gate = evaluate_gate(engine, ref, windows, prompts)
    assert gate.positions == 3 * 63
    assert gate.tie_aware_agreement == 1.0 and gate.raw_agreement == 1.0 and gate.passed
    assert abs(gate.perplexity - gate.reference_perplexity) < 1e-3 * gate.reference_perplexity
    assert gate.kl_divergence < 1e-6
    assert gate.drift_agreement == 1.0 and gate.drift_first_divergence == 24


def test_damaged_numerics_fail_the_gate(sharp_llama):
    windows, prompts = _windows(sharp_llama.config.vocab_size)
    ref = compute_reference(sharp_llama, windows, prompts, drift_tokens=16)
    engine = build_engine(sharp_llama, DeployConfig(), dtype=torch.float32)
    with torch.no_grad():  # as if a quantizer had lost half of the hidden features before the head
        engine.model.final_norm[::2] = 0
    gate = evaluate_gate(engine, ref, windows, prompts, min_agreement=0.995)
    assert not gate.passed and gate.tie_aware_agreement < 0.995
    assert gate.raw_agreement <= gate.tie_aware_agreement  # tie-aware only ever forgives, never adds losses
    assert gate.kl_divergence > 0.01 and gate.perplexity != gate.reference_perplexity


def test_tie_epsilon_forgives_only_near_ties(sharp_llama):
    windows, prompts = _windows(sharp_llama.config.vocab_size)
    ref = compute_reference(sharp_llama, windows, prompts, drift_tokens=8)
    engine = build_engine(sharp_llama, DeployConfig(), dtype=torch.float32)
    with torch.no_grad():
        engine.model.final_norm[::3] = 0
    strict = evaluate_gate(engine, ref, windows, prompts, tie_epsilon=0.0)
    loose = evaluate_gate(engine, ref, windows, prompts, tie_epsilon=1.0)
    assert strict.tie_aware_agreement == strict.raw_agreement
    assert loose.tie_aware_agreement == 1.0
