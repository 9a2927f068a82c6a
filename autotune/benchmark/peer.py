"""The benchmark of a peer engine's runner (llama.cpp's context, OpenVINO's pipeline) on a workload: the same
prompts, warm-up, timed-run policy and figures as autotune's own benchmark (autotune/benchmark/), its requests run
through the peer's continuous batching."""
from __future__ import annotations

import time

from autotune.benchmark.bench import run_figures, stopped, summarize  # one definition of every figure, for every engine
from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak, trim_heap
from autotune.benchmark.policy import RunPolicy, timed_runs
from autotune.config.workload import Workload
from autotune.engine.peer import PeerRunner
from autotune.engine.sequence import Request
from autotune.progress import log

__all__ = ["benchmark_peer"]


def benchmark_peer(ctx: PeerRunner, prompts: list[list[int]], workload: Workload, *, base_rss: int,
                   policy: RunPolicy | None = None) -> dict:
    """Warm-up, then timed runs of the whole workload as `policy` says. Peak memory is this process's high-water
    mark during the runs minus `base_rss` (the process before the weights were loaded): the weights as far as they
    were touched, the KV cache, the compute buffers and the logits."""
    policy = policy or RunPolicy(warmup="short")
    n = workload.output_tokens
    requests = [Request(p, n, min_new_tokens=n) for p in prompts]
    started = time.perf_counter()
    wave = min(ctx.config.batch_size, len(prompts))
    ctx.run([Request(p, min(4, n), min_new_tokens=min(4, n)) for p in prompts[:wave]] if policy.warmup == "short"
            else requests)
    warmup_s = time.perf_counter() - started
    trim_heap()
    peak_reset = reset_peak()

    def one_run() -> dict:
        t0 = time.perf_counter()
        completions = ctx.run(requests)
        return run_figures(completions, time.perf_counter() - t0)

    runs, stop = timed_runs(one_run, policy, log)
    out = {**summarize(runs), **stopped(stop), "warmup_s": warmup_s,
           "peak_memory_mb": (peak_rss_bytes() - base_rss) / 2**20, "peak_memory_reset": peak_reset,
           "concurrency_peak": wave}
    if not peak_reset:
        out["peak_memory_note"] = "the high-water mark could not be reset: it includes loading and the gate"
    return out
