"""The analytical simulator: arithmetic against published hardware figures, feasibility, monotonicity, speed,
labelling."""
from __future__ import annotations

import dataclasses
import time

import pytest

from autotune.config.deploy import DeployConfig
from autotune.config.workload import Workload
from autotune.models.registry import resolve_model
from autotune.sim import load_profile, predict
from autotune.sim.cost import ACT_BYTES
from autotune.sim.hardware import list_profiles

KIB, MIB, GIB = 2**10, 2**20, 2**30
ACCELERATORS = [p for p in list_profiles() if p != "cpu-local"]  # cpu-local measures this machine first
# The reference deployment on an Ascend 910: W8A16 with fp16 activations (the 910 has no bf16).
REFERENCE = DeployConfig(quant="w8a16", fusion_level="O2", layers_per_subgraph=2, batch_size=1, page_size=256,
                         dtype="fp16")


def test_kv_bytes_per_token_match_facts():
    assert resolve_model("llama-7b").kv_bytes_per_token(ACT_BYTES) == 512 * KIB
    assert resolve_model("llama-3-8b").kv_bytes_per_token(ACT_BYTES) == 128 * KIB
    assert resolve_model("qwen2-7b").kv_bytes_per_token(ACT_BYTES) == 56 * KIB


def test_kv_pages_match_facts():
    # llama-7b: a 256-token page is 128 MiB; 2048 tokens are 1 GiB (+ the engine's one scratch page)
    profile = load_profile("ascend910")
    workload = Workload(num_requests=1, prompt_min=1024, prompt_max=1024, output_tokens=1024)
    config = DeployConfig(batch_size=1, page_size=256, kv_policy="preallocate", dtype="fp16")
    p = predict(resolve_model("llama-7b"), config, workload, profile)
    assert p.kv_pages == 8
    assert p.kv_reserved_mb * MIB == GIB + 128 * MIB


def test_kv_policies_reserve_as_documented():
    spec, profile = resolve_model("llama-7b"), load_profile("ascend910")
    # 16 requests of 100..400 prompt + 100 output, batch 4 admitted at a time, pages of 16 tokens
    workload = Workload(num_requests=16, prompt_min=100, prompt_max=400, output_tokens=100)
    pages = {policy: predict(spec, DeployConfig(batch_size=4, page_size=16, kv_policy=policy, dtype="fp16"), workload,
                             profile).kv_pages for policy in ("preallocate", "on_demand", "pool")}
    assert pages["preallocate"] == 4 * 32  # every slot reserves the maximum 500 tokens
    assert pages["on_demand"] == 4 * 22  # the mean request at its end: 350 tokens
    assert pages["on_demand"] < pages["pool"] <= pages["preallocate"]


def test_a_config_that_cannot_fit_32_gb_is_infeasible():
    workload = Workload(num_requests=16, prompt_min=1024, prompt_max=1024, output_tokens=1024)
    config = DeployConfig(quant="none", batch_size=16, page_size=128, kv_policy="preallocate", dtype="fp16")
    p = predict(resolve_model("llama-13b"), config, workload, load_profile("ascend910"))
    assert not p.feasible
    assert "32 GiB" in p.reason and "KV pages" in p.reason
    assert predict(resolve_model("llama-7b"), REFERENCE, Workload(), load_profile("ascend910")).feasible


def test_calibrated_ascend910_reproduces_the_reference_batch1_figures():
    workload = Workload(num_requests=1, prompt_min=128, prompt_max=128, output_tokens=256)
    p = predict(resolve_model("llama-7b"), REFERENCE, workload, load_profile("ascend910"))
    assert p.tpot_p50_ms == pytest.approx(21, rel=0.1)
    assert p.ttft_p50_ms == pytest.approx(98, rel=0.1)
    assert p.throughput_tok_s == pytest.approx(48, rel=0.1)


def _configs(profile):
    for dtype in profile.tflops:
        for quant in ("none", "w8a16", "w8a8", "w4a16"):
            for fusion, lps in (("O0", None), ("O1", 1), ("O2", 0)):
                for policy in ("preallocate", "on_demand", "pool"):
                    yield dict(quant=quant, fusion_level=fusion, layers_per_subgraph=lps, kv_policy=policy, dtype=dtype)


@pytest.mark.parametrize("name", ACCELERATORS)
def test_more_bandwidth_is_never_slower(name):
    spec, profile = resolve_model("llama-7b"), load_profile(name)
    faster = dataclasses.replace(profile, bandwidth_gbs=profile.bandwidth_gbs * 2)
    for params in _configs(profile):
        for batch in (1, 8):
            config = DeployConfig(batch_size=batch, **params)
            slow, fast = predict(spec, config, Workload(), profile), predict(spec, config, Workload(), faster)
            assert fast.tpot_p99_ms <= slow.tpot_p99_ms and fast.ttft_p99_ms <= slow.ttft_p99_ms
            assert fast.throughput_tok_s >= slow.throughput_tok_s


@pytest.mark.parametrize("model", ["llama-7b", "llama-3-8b", "smollm2-135m"])
def test_bigger_batch_never_less_memory(model):
    spec, profile = resolve_model(model), load_profile("h100")
    for params in _configs(profile):
        for page in (16, 256):
            memory = [predict(spec, DeployConfig(batch_size=b, page_size=page, **params), Workload(num_requests=64),
                              profile).peak_memory_mb for b in (1, 2, 4, 8, 16, 32, 64)]
            assert memory == sorted(memory)


def test_fewer_bigger_subgraphs_launch_less():
    spec, profile = resolve_model("llama-7b"), load_profile("ascend910")
    tpot = [predict(spec, DeployConfig(quant="w8a16", fusion_level="O2", layers_per_subgraph=lps, batch_size=1,
                                       dtype="fp16"),
                    Workload(), profile).breakdown["decode_overhead_ms"] for lps in (1, 2, 4, 8, 0)]
    assert tpot == sorted(tpot, reverse=True)


def test_prediction_takes_well_under_a_millisecond():
    spec, profile = resolve_model("llama-7b"), load_profile("ascend910")
    predict(spec, REFERENCE, Workload(), profile)
    n = 500
    t0 = time.perf_counter()
    for _ in range(n):
        predict(spec, REFERENCE, Workload(), profile)
    assert (time.perf_counter() - t0) / n < 1e-3  # typically 25-90 us here; margin for a busy machine


@pytest.mark.parametrize("name", list_profiles())
def test_profiles_state_sources_and_calibration(name):
    from autotune.sim.hardware import read_profile_data

    data = read_profile_data(name)
    assert data["sources"] and data["version"] >= 1
    assert data["calibration"]["source"]
    if name in ("ascend910", "a100-80g", "h100"):
        assert data["calibration"]["factors"] and data["calibration"]["anchors"]


def test_clock_scaling_by_device_power():
    spec, profile = resolve_model("llama-7b"), load_profile("h100")
    workload = Workload(num_requests=8, prompt_min=2048, prompt_max=2048, output_tokens=16)  # compute-bound prefill
    ttft = [predict(spec, DeployConfig(device_power=level, batch_size=8), workload, profile).ttft_p50_ms
            for level in (1, 2, 4, 8)]
    assert ttft == sorted(ttft, reverse=True) and ttft[0] > ttft[-1]
