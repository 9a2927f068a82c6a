"""The benchmark: warm-up, repeated runs of a workload, medians and spread of what a user feels."""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from autotune.benchmark.meter import HOST, PEAK_NOT_RESET, Meter
from autotune.benchmark.policy import RunPolicy, doubt_of, timed_runs
from autotune.config.workload import Workload
from autotune.engine import Completion, Engine, Request
from autotune.progress import log

__all__ = ["benchmark_engine", "benchmark_hf_generate", "summarize", "run_figures", "percentile", "stopped"]


def percentile(values: list[float], q: float) -> float:
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
    if all("others_cores" in r for r in runs):
        out["others_cores_max"] = max(r["others_cores"] for r in runs)
    return out


def stopped(stop: str) -> dict:
    """timed_runs' stop as a result's figures: why the runs ended, and `doubt` where none could be trusted."""
    reason = doubt_of(stop)
    return {"repeats_stop": stop, **({"doubt": reason} if reason else {})}


def run_figures(completions: list[Completion], seconds: float) -> dict:
    ttft = [c.ttft * 1e3 for c in completions]
    tpot = [c.tpot * 1e3 for c in completions if c.tpot is not None]
    tokens = sum(len(c.output_ids) for c in completions)
    return {
        "throughput_tok_s": tokens / seconds,
        "ttft_p50_ms": percentile(ttft, 0.5), "ttft_p99_ms": percentile(ttft, 0.99),
        "tpot_p50_ms": percentile(tpot, 0.5) if tpot else 0.0,
        "tpot_p99_ms": percentile(tpot, 0.99) if tpot else 0.0,
    }


def benchmark_engine(engine: Engine, prompts: list[list[int]], workload: Workload, *, policy: RunPolicy | None = None,
                     base_rss: int, device: Meter = HOST, cut: Callable[[dict], str | None] | None = None,
                     bucketed: bool = False) -> dict:
    """Run the workload on one runner (its cache persists, as in serving) as `policy` says: warm-up, an optional
    screening wave, then timed runs of the whole workload (benchmark/policy.py).

    Peak memory is the process's measured high-water mark during the runs, minus `base_rss` (the process
    before any weights were loaded): weights, KV cache, activations and compiled code, as the OS saw them.
    `device` (benchmark/meter.py) says how: on the CPU the process's high-water mark as above; on an accelerator
    (autotune/devices/base.py) its allocator's (weights, KV pools, activations), every clock read waiting for the
    device's queued work first.

    `cut` sees the figures so far (peak memory included) after the screening wave and after each timed run, and
    may end the benchmark with a reason (a configuration clearly dominated needs no more precise figures). A
    configuration cut at its screen carries the screen's figures and says so (`screened_out`); a cut after a
    timed run says so in `repeats_cut`. `repeats_stop` says which rule ended the timed runs. `bucketed`: on the
    serving runner's graphs (Engine.runner), as `autotune serve` runs them."""
    policy = policy or RunPolicy()
    runner = engine.runner(max_seq_len=workload.max_seq_len,
                           pool_tokens=engine.config.batch_size * workload.max_seq_len, bucketed=bucketed)
    eos = engine.model.eos_token_id

    def requests(count: int, new_tokens: int) -> list[Request]:
        return [Request(p, new_tokens, min_new_tokens=new_tokens, eos_token_id=eos) for p in prompts[:count]]

    full = requests(len(prompts), workload.output_tokens)
    wave = min(engine.config.batch_size, len(prompts))
    sync = device.synchronize
    peak_reset = device.start_peak()
    started = time.perf_counter()
    # Eager kernels need one call to be warm; a compiled build meets each of its graphs in one whole run.
    runner.run(requests(wave, min(4, workload.output_tokens)) if policy.warmup == "short" else full)
    sync()
    warmup_s = time.perf_counter() - started
    runner.peak_running = 0  # the warm-up's short requests reserve fewer pages than the workload's

    def peak_mb() -> float:
        return device.peak_since(base_rss) / 2**20

    def timed(reqs: list[Request]) -> dict:
        t0 = time.perf_counter()
        completions = runner.run(reqs)
        sync()
        return run_figures(completions, time.perf_counter() - t0)

    marks: dict = {}
    if policy.screen and wave < len(prompts):
        screen = timed(requests(wave, workload.output_tokens))
        log(f"  screen (one wave of {wave} requests): {screen['throughput_tok_s']:.1f} tok/s")
        marks["screen"] = screen
        reason = cut({**screen, "peak_memory_mb": peak_mb()}) if cut is not None else None
        if reason:
            log(f"  screened out: {reason}")
            result = {**summarize([screen]), "repeats": 0, "screened_out": f"{reason}; the whole workload did not run"}
            return {**result, **_memory(runner, peak_mb(), warmup_s), **_peak_marks(peak_reset)}
    runs, stop = timed_runs(lambda: timed(full), policy, log,
                            (lambda rs: cut({**summarize(rs), "peak_memory_mb": peak_mb()})) if cut else None)
    result = {**summarize(runs), **marks, **stopped(stop)}
    if stop.startswith("cut: "):
        result["repeats_cut"] = stop.removeprefix("cut: ")
        log(f"  {result['repeats_cut']}")
    return {**result, **_memory(runner, peak_mb(), warmup_s), **_peak_marks(peak_reset)}


def _memory(runner, peak_mb: float, warmup_s: float) -> dict:
    return {"peak_memory_mb": peak_mb, "kv_reserved_peak_mb": runner.cache.reserved_bytes / 2**20,
            "kv_pages_peak": runner.cache.peak_pages_in_use, "warmup_s": warmup_s,
            "concurrency_peak": runner.peak_running}


def _peak_marks(reset: bool) -> dict:
    return {"peak_memory_reset": True} if reset else {"peak_memory_reset": False, "peak_memory_note": PEAK_NOT_RESET}


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


# The speed baselines are what every gain is read against: never fewer than two timed runs, so that their spread
# is known, and more time for them than a trial's runs get.
BASELINE_POLICY = RunPolicy(warmup="short", min_repeats=2, max_repeats=3, time_cap_s=120.0)


@torch.inference_mode()
def benchmark_hf_generate(hf_model, prompts: list[list[int]], workload: Workload, batch_size: int, pad_id: int,
                          *, policy: RunPolicy = BASELINE_POLICY, base_rss: int, device: Meter = HOST) -> dict:
    """The speed baseline: transformers' own generate, batches of `batch_size` prompts (left-padded), in turn.
    The warm-up is one batch of a few tokens ("short") or the whole workload ("full")."""
    def one_run(chunks: list[list[list[int]]] | None = None, new_tokens: int | None = None) -> dict:
        completions: list[Completion] = []
        new_tokens = new_tokens or workload.output_tokens
        start = time.perf_counter()
        for chunk in chunks or [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]:
            width = max(map(len, chunk))
            ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            streamer = _TokenTimes()
            ids, mask = ids.to(device.torch_device), mask.to(device.torch_device)  # where the weights are
            hf_model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, pad_token_id=pad_id, streamer=streamer)
            for p in chunk:
                c = Completion(Request(p, workload.output_tokens), arrival=start)
                c.token_times = list(streamer.times)
                c.output_ids = [0] * len(streamer.times)
                completions.append(c)
        return run_figures(completions, time.perf_counter() - start)

    peak_reset = device.start_peak()
    started = time.perf_counter()
    if policy.warmup == "short":
        one_run([prompts[:batch_size]], min(4, workload.output_tokens))
    else:
        one_run()
    warmup_s = time.perf_counter() - started
    runs, stop = timed_runs(one_run, policy, log)
    result = {**summarize(runs), **stopped(stop), "warmup_s": warmup_s}
    result["peak_memory_mb"] = device.peak_since(base_rss) / 2**20
    result.update(_peak_marks(peak_reset))
    return result
