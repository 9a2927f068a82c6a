"""The simulator reads the architecture facts the engine builds from: GQA's KV heads, Gemma's head_dim, tied
embeddings, and sliding windows, which bound the KV a windowed layer holds and reads."""
from __future__ import annotations

import dataclasses
import math

import pytest

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.sim import load_profile, predict
from autotune.sim.cost import ACT_BYTES, step_cost, weight_bytes
from autotune.sim.memory_estimate import kv_bytes_reserved

KIB = 2**10
LONG = Workload(num_requests=4, prompt_min=6000, prompt_max=6000, output_tokens=1000)


def _unwindowed(spec):
    return dataclasses.replace(spec, sliding_window=0, num_sliding_layers=0)


def test_kv_per_token_follows_gqa_and_head_dim():
    assert resolve_model("mistral-7b").kv_bytes_per_token(ACT_BYTES) == 128 * KIB  # 32 layers x 8 KV heads x 128
    assert resolve_model("gemma-2-9b").kv_bytes_per_token(ACT_BYTES) == 2 * 42 * 8 * 256 * 2
    mha = dataclasses.replace(resolve_model("llama-3-8b"), num_kv_heads=32)
    assert mha.kv_bytes_per_token(ACT_BYTES) == 4 * resolve_model("llama-3-8b").kv_bytes_per_token(ACT_BYTES)


def test_tied_embeddings_are_stored_once():
    gemma = resolve_model("gemma-2-9b")
    untied = dataclasses.replace(gemma, tied_embeddings=False)
    assert weight_bytes(untied, "none") - weight_bytes(gemma, "none") == gemma.vocab_size * gemma.hidden_size * 2


@pytest.mark.parametrize("name", ["gemma-2-9b", "mistral-7b", "phi-3-mini", "gemma-3-1b"])
def test_sliding_windows_reduce_kv_memory_past_the_window_only(name):
    spec = resolve_model(name)
    config = DeployConfig(batch_size=4, page_size=256, kv_policy="preallocate")
    short = Workload(num_requests=4, prompt_min=100, prompt_max=200, output_tokens=100)
    assert kv_bytes_reserved(spec, config, short) == kv_bytes_reserved(_unwindowed(spec), config, short)
    windowed, full = kv_bytes_reserved(spec, config, LONG), kv_bytes_reserved(_unwindowed(spec), config, LONG)
    # Windowed layers hold the pages of their window (+1 for alignment) per sequence, plus the scratch page.
    per_layer_page = config.page_size * spec.kv_bytes_per_token_layer(ACT_BYTES)
    window_pages = 4 * (math.ceil(spec.sliding_window / 256) + 1) + 1
    full_pages = 4 * math.ceil(LONG.max_seq_len / 256) + 1
    assert windowed == per_layer_page * (spec.num_full_layers * full_pages + spec.num_sliding_layers * window_pages)
    assert windowed < full


def test_gemma2_alternating_windows_halve_long_context_kv():
    spec = resolve_model("gemma-2-9b")  # 21 of 42 layers windowed at 4096
    config = DeployConfig(batch_size=4, page_size=256, kv_policy="preallocate")
    long = Workload(num_requests=4, prompt_min=7000, prompt_max=7000, output_tokens=1000)
    ratio = kv_bytes_reserved(spec, config, long) / kv_bytes_reserved(_unwindowed(spec), config, long)
    assert ratio == pytest.approx((1 + 17 / 32) / 2, rel=0.01)  # 17 pages of the window (+1), of 32


def test_windowed_layers_read_and_attend_within_the_window():
    spec = resolve_model("mistral-7b")  # every layer windowed at 4096
    near = step_cost(spec, "none", False, rows=1, new_tokens=1, context=1000.0, page_size=128)
    assert near == step_cost(_unwindowed(spec), "none", False, rows=1, new_tokens=1, context=1000.0, page_size=128)
    far = step_cost(spec, "none", False, rows=1, new_tokens=1, context=20000.0, page_size=128)
    farther = step_cost(spec, "none", False, rows=1, new_tokens=1, context=30000.0, page_size=128)
    assert far.kv_bytes == farther.kv_bytes and far.attention_flops == farther.attention_flops  # bounded
    unbounded = step_cost(_unwindowed(spec), "none", False, rows=1, new_tokens=1, context=20000.0, page_size=128)
    assert far.kv_bytes < unbounded.kv_bytes / 4 and far.attention_flops < unbounded.attention_flops / 4
    # prefill of a prompt longer than the window: each token attends to at most the window
    prefill = step_cost(spec, "none", False, rows=1, new_tokens=8192, context=0.0, page_size=128)
    expected = 4 * spec.num_layers * spec.num_heads * spec.head_dim * (4096 * 4097 / 2 + 4096 * 4096)
    assert prefill.attention_flops == pytest.approx(expected)


def test_predictions_carry_the_windowed_kv():
    spec, profile = resolve_model("phi-3-mini"), load_profile("h100")  # every layer windowed at 2047
    config = DeployConfig(quant="none", batch_size=8, page_size=128, kv_policy="preallocate")
    workload = Workload(num_requests=8, prompt_min=3000, prompt_max=3000, output_tokens=512)
    windowed, full = predict(spec, config, workload, profile), predict(_unwindowed(spec), config, workload, profile)
    assert windowed.kv_reserved_mb == pytest.approx(full.kv_reserved_mb * (8 * 17 + 1) / (8 * 28 + 1))
    assert windowed.peak_memory_mb < full.peak_memory_mb and windowed.tpot_p50_ms <= full.tpot_p50_ms
