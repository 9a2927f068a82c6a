"""The benchmark: warm-up, repeated runs of a workload, medians and spread of what a user feels."""
from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable

import torch

from autotune.benchmark.peak_rss import peak_rss_bytes, reset_peak, trim_heap
from autotune.config.workload import Workload
from autotune.engine import Completion, Engine, Request
from autotune.progress import log

__all__ = ["benchmark_engine", "benchmark_hf_generate", "summarize"]


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(runs: list[dict]) -> dict:
    """Medians over repeats of each repeat's figures; the spread of throughput as min and max."""
    out = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    tput = [r["throughput_tok_s"] for r in runs]
    out["throughput_min"], out["throughput_max"] = min(tput), max(tput)
    out["repeats"] = len(runs)
    return out


def _run_figures(completions: list[Completion], seconds: float) -> dict:
    ttft = [c.ttft * 1e3 for c in completions]
    tpot = [c.tpot * 1e3 for c in completions if c.tpot is not None]
    tokens = sum(len(c.output_ids) for c in completions)
    return {
        "throughput_tok_s": tokens / seconds,
        "ttft_p50_ms": _percentile(ttft, 0.5), "ttft_p99_ms": _percentile(ttft, 0.99),
        "tpot_p50_ms": _percentile(tpot, 0.5) if tpot else 0.0,
        "tpot_p99_ms": _percentile(tpot, 0.99) if tpot else 0.0,
    }


def benchmark_engine(engine: Engine, prompts: list[list[int]], workload: Workload, *, repeats: int = 3,
                     warmup: int = 2, base_rss: int, device=None,
                     cut: Callable[[dict], str | None] | None = None) -> dict:
    """Run the workload `warmup` + `repeats` times on one runner (its cache persists, as in serving).

    Peak memory is the process's measured high-water mark during the runs, minus `base_rss` (the process
    before any weights were loaded): weights, KV cache, activations and compiled code, as the OS saw them.
    With an accelerator `device` (autotune/devices/base.py), peak memory is its allocator's high-water mark
    (weights, KV pools, activations) and every clock read waits for the device's queued work first.

    `cut` sees the figures so far after each timed run (peak memory included) and may end the repeats early with
    a reason (successive halving: a configuration clearly dominated needs no more precise figures); the reason is
    kept in the result as `repeats_cut`."""
    runner = engine.runner(max_seq_len=workload.max_seq_len,
                           pool_tokens=engine.config.batch_size * workload.max_seq_len)
    eos = engine.model.eos_token_id
    requests = [Request(p, workload.output_tokens, min_new_tokens=workload.output_tokens, eos_token_id=eos)
                for p in prompts]
    sync = device.synchronize if device is not None else _no_sync
    peak_reset = _reset_peak(device)
    started = time.perf_counter()
    for i in range(warmup):
        runner.run(requests)
    sync()
    warmup_s = time.perf_counter() - started
    runs = []
    cut_reason = None

    def peak_mb() -> float:
        return (device.peak_memory_bytes() if device is not None else peak_rss_bytes() - base_rss) / 2**20

    for i in range(repeats):
        t0 = time.perf_counter()
        completions = runner.run(requests)
        sync()
        runs.append(_run_figures(completions, time.perf_counter() - t0))
        log(f"  repeat {i + 1}/{repeats}: {runs[-1]['throughput_tok_s']:.1f} tok/s")
        if cut is not None and i + 1 < repeats:
            cut_reason = cut({**summarize(runs), "peak_memory_mb": peak_mb()})
            if cut_reason:
                cut_reason = f"{cut_reason}; stopped after {i + 1} of {repeats} timed runs"
                log(f"  {cut_reason}")
                break
    result = summarize(runs)
    if cut_reason:
        result["repeats_cut"] = cut_reason
    result.update(
        peak_memory_mb=peak_mb(),
        kv_reserved_peak_mb=runner.cache.reserved_bytes / 2**20,
        kv_pages_peak=runner.cache.peak_pages_in_use,
        warmup_s=warmup_s,
    )
    result.update(_peak_marks(peak_reset))
    return result


# Where the kernel refuses /proc/PID/clear_refs (some containers), the process's high-water mark cannot be brought
# down to the present: the peak then also holds loading the weights, building and the gate, and says so.
_PEAK_NOT_RESET = ("the memory high-water mark could not be reset before the runs (/proc/PID/clear_refs refused): "
                  "this peak includes loading, building and gating, not only the runs")


def _reset_peak(device) -> bool:
    if device is not None:
        device.reset_peak_memory()  # an accelerator allocator's statistics: always resettable
        return True
    gc.collect()
    trim_heap()  # memory already freed is not the runs' memory
    if reset_peak():
        return True
    log(f"  peak memory: {_PEAK_NOT_RESET}")
    return False


def _peak_marks(reset: bool) -> dict:
    return {"peak_memory_reset": True} if reset else {"peak_memory_reset": False, "peak_memory_note": _PEAK_NOT_RESET}


def _no_sync() -> None:
    return None  # CPU kernels have finished when they return


class _TokenTimes:
    """A transformers streamer that only records when each generated token (for the whole batch) appeared."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value) -> None:
        if not self._prompt_seen:  # generate() first passes the prompt itself
            self._prompt_seen = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@torch.inference_mode()
def benchmark_hf_generate(hf_model, prompts: list[list[int]], workload: Workload, batch_size: int, pad_id: int,
                          *, repeats: int = 3, warmup: int = 2, base_rss: int, device=None) -> dict:
    """The speed baseline: transformers' own generate, batches of `batch_size` prompts (left-padded), in turn."""
    def one_run() -> dict:
        completions: list[Completion] = []
        start = time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            width = max(map(len, chunk))
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            streamer = _TokenTimes()
            if device is not None:  # an accelerator: inputs go where the weights are
                ids, mask = ids.to(device.torch_device), mask.to(device.torch_device)
            hf_model.generate(ids, attention_mask=mask, max_new_tokens=workload.output_tokens,
                              min_new_tokens=workload.output_tokens, do_sample=False, pad_token_id=pad_id,
                              streamer=streamer)
            for p in chunk:
                c = Completion(Request(p, workload.output_tokens), arrival=start)
                c.token_times = list(streamer.times)
                c.output_ids = [0] * len(streamer.times)
                completions.append(c)
        return _run_figures(completions, time.perf_counter() - start)

    peak_reset = _reset_peak(device)
    for _ in range(warmup):
        one_run()
    runs = []
    for i in range(repeats):
        runs.append(one_run())
        log(f"  repeat {i + 1}/{repeats}: {runs[-1]['throughput_tok_s']:.1f} tok/s")
    result = summarize(runs)
    result["peak_memory_mb"] = (device.peak_memory_bytes() if device is not None
                                else peak_rss_bytes() - base_rss) / 2**20
    result.update(_peak_marks(peak_reset))
    return result
