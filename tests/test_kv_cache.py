"""The paged KV cache: what each policy reserves, and page bookkeeping."""
from __future__ import annotations

import pytest
import torch

from autotune.engine.kv_cache import OutOfPages, PagedKVCache

# SmolLM2-135M's cache geometry: 30 layers, 3 KV heads of 64, bf16.
SMOL = dict(num_layers=30, num_kv_heads=3, head_dim=64, dtype=torch.bfloat16)


def _reserve(policy: str, page_size: int = 128, requests: int = 8, tokens: int = 128) -> PagedKVCache:
    cache = PagedKVCache(page_size=page_size, policy=policy, max_seq_len=2048, max_batch=requests, **SMOL)
    for seq in range(requests):
        cache.allocate(seq, tokens)
    return cache


def test_on_demand_reserves_a_small_fraction_of_preallocate_for_short_requests():
    on_demand, prealloc = _reserve("on_demand"), _reserve("preallocate")
    # 8 requests of 128 tokens against a 2,048-token maximum: preallocate holds 16 pages a sequence.
    assert prealloc.reserved_bytes >= 8 * 2048 * 2 * 30 * 3 * 64 * 2
    assert on_demand.reserved_bytes / prealloc.reserved_bytes < 0.15
    print(f"on_demand {on_demand.reserved_bytes / 2**20:.1f} MiB vs preallocate {prealloc.reserved_bytes / 2**20:.1f} MiB")


def test_pages_follow_tokens_and_are_reused_after_free():
    cache = PagedKVCache(page_size=16, policy="on_demand", max_seq_len=256, max_batch=2, **SMOL)
    cache.allocate(0, 20)
    assert cache.pages_in_use == 2
    assert cache.extend(0, 32) is False and cache.extend(0, 33) is True and cache.pages_in_use == 3
    cache.free(0)
    before = cache.num_pages
    cache.allocate(1, 40)
    assert cache.num_pages == before and cache.pages_in_use == 3


def test_pool_policy_is_fixed_and_refuses_beyond_it():
    cache = PagedKVCache(page_size=16, policy="pool", max_seq_len=64, max_batch=2, pool_tokens=64, **SMOL)
    size = cache.reserved_bytes
    cache.allocate(0, 20, max_tokens=40)  # reserves its whole length: 3 pages
    assert cache.pages_in_use == 3 and cache.extend(0, 40) is False
    assert cache.free_pages == 1 and cache.pages_to_admit(16) == 1 and cache.pages_to_admit(17) == 2
    cache.allocate(1, 16, max_tokens=16)
    with pytest.raises(OutOfPages):
        cache.extend(1, 17)
    assert cache.reserved_bytes == size


def test_pool_admits_only_what_fits_together_and_never_runs_out(tiny_llama):
    from autotune.config.deploy import DeployConfig
    from autotune.engine import Request, build_engine

    engine = build_engine(tiny_llama, DeployConfig(batch_size=4, page_size=8, kv_policy="pool", dtype="fp32"))
    # Room for 5 pages of 8 tokens; each request may reach 20 tokens (3 pages): one at a time, not 4.
    runner = engine.runner(max_seq_len=24, pool_tokens=40)
    outs = runner.run([Request([5, 6, 7, 8], 16, min_new_tokens=16) for _ in range(4)])
    assert all(len(o.output_ids) == 16 for o in outs)
    assert runner.cache.peak_pages_in_use <= runner.cache.usable_pages
    assert runner.peak_running == 1  # what ran at once, which the benchmark records


def test_the_benchmark_records_the_concurrency_that_ran(tiny_llama):
    """A pool sized in tokens for the batch loses sequences to page rounding (20-token prompts + 8 new at pages of
    16: 2 pages each, but 4 x 28 tokens are 7 pages): 3 of 4 run at once, and the figures say so."""
    from autotune.benchmark.bench import benchmark_engine
    from autotune.benchmark.policy import RunPolicy
    from autotune.config.deploy import DeployConfig
    from autotune.config.workload import Workload
    from autotune.engine import build_engine

    workload = Workload(num_requests=8, prompt_min=20, prompt_max=20, output_tokens=8)
    prompts = [[5 + i] * 20 for i in range(8)]
    figures = {}
    for policy in ("pool", "on_demand"):
        engine = build_engine(tiny_llama, DeployConfig(batch_size=4, page_size=16, kv_policy=policy, dtype="fp32"))
        figures[policy] = benchmark_engine(engine, prompts, workload, policy=RunPolicy(max_repeats=1), base_rss=0)
    assert figures["pool"]["concurrency_peak"] == 3 and figures["on_demand"]["concurrency_peak"] == 4
    # The front's table reads the pool's point at the concurrency that ran.
    import optuna

    from autotune.results.tables import pareto_table

    for policy, mark in (("pool", True), ("on_demand", False)):
        study = optuna.create_study(directions=["maximize", "minimize", "minimize"])
        config = DeployConfig(batch_size=4, page_size=16, kv_policy=policy, dtype="fp32")
        b = figures[policy]
        study.add_trial(optuna.trial.create_trial(
            values=[b["throughput_tok_s"], b["tpot_p99_ms"], 1.0],
            user_attrs={"config": config.to_dict(), "bench": b, "gate": {"tie_aware_agreement": 1.0}}))
        assert ("(ran 3)" in pareto_table(study)) is mark


def test_a_request_larger_than_the_pool_is_refused_clearly(tiny_llama):
    from autotune.config.deploy import DeployConfig
    from autotune.engine import Request, build_engine

    engine = build_engine(tiny_llama, DeployConfig(batch_size=2, page_size=8, kv_policy="pool", dtype="fp32"))
    runner = engine.runner(max_seq_len=64, pool_tokens=16)
    with pytest.raises(OutOfPages, match="needs"):
        runner.run([Request([5] * 30, 40)])  # 70 tokens: more than the 64 the pool was sized for


def test_slots_address_the_sequence_pages():
    cache = PagedKVCache(page_size=4, policy="on_demand", max_seq_len=64, max_batch=2, **SMOL)
    cache.allocate(0, 6)
    pages = cache.block_row(0)[:2]
    assert cache.slots(0, 0, 6).tolist() == [pages[0] * 4 + i for i in range(4)] + [pages[1] * 4, pages[1] * 4 + 1]
    assert 0 not in pages  # page 0 is the scratch page of padded rows
