"""The simulator's goodput: a discrete-event run of the serving scheduler `autotune serve` runs (engine/scheduler.py:
continuous batching, the prefill chunk, the KV page pool) over the arrival process, every forward taking the time
the analytical model predicts for it (sim/predict.step_seconds), on a virtual clock. The open-loop driver and the
rate search of a measured trial read it (benchmark/open_loop.py, benchmark/goodput.py), so that a prediction and a
measurement count a request, a warm-up and an early stop alike.

What it leaves out: the run-to-run noise of a real machine (every step of one shape takes one time), and a peer
runtime's own scheduler (OpenVINO's and llama.cpp's configurations are run as their engine stand-in,
sim/stand_in.py, under the engine's scheduler)."""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from autotune.benchmark.goodput import PROBE_REQUESTS, find_goodput, goodput_workload
from autotune.benchmark.open_loop import OpenLoopRun, run_open_loop
from autotune.config.arrival import load_requests
from autotune.config.deploy import DeployConfig
from autotune.config.slo import Slo
from autotune.config.workload import Workload
from autotune.engine.kv_cache import PagedKVCache
from autotune.engine.runner import batch_buckets
from autotune.engine.scheduler import PrefillBatch, Scheduler, length_groups
from autotune.engine.sequence import Sequence
from autotune.engine.serving import configured_chunk
from autotune.engine.stepped import SteppedRunner
from autotune.models.registry import ModelSpec
from autotune.sim.cost import step_cost
from autotune.sim.hardware import HardwareProfile
from autotune.sim.predict import predict, step_seconds

__all__ = ["VirtualClock", "SimulatedRunner", "predict_goodput", "SIM_PROBE_REQUESTS"]

# Requests per simulated probe: a simulated request costs microseconds, so more of them than a measured probe
# sends (PROBE_REQUESTS), which makes a prediction's attainment less a matter of one draw of arrivals.
SIM_PROBE_REQUESTS = 4 * PROBE_REQUESTS
# The token every simulated step emits: no vocabulary's end-of-sequence id, so a request runs to its length.
_TOKEN = -1


@dataclass(slots=True)
class VirtualClock:
    """The time source of a simulated run: it moves only when a forward runs or the driver waits."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


class SimulatedRunner(SteppedRunner):
    """A StepRunner (engine/peer.py) whose forwards take the predicted time. It runs the serving runner's scheduler
    and page accounting (engine/build.Engine.runner with `bucketed`): a pool of batch * max_seq_len tokens, the
    configuration's prefill chunk, decode steps padded to a batch bucket where the engine is compiled, and on the
    CPU reading only the pages their rows use (the pool's slots hold one element: only the pages are counted)."""

    def __init__(self, spec: ModelSpec, config: DeployConfig, profile: HardwareProfile, max_seq_len: int,
                 clock: VirtualClock) -> None:
        self.spec, self.config, self.profile, self.clock = spec, config, profile, clock
        self.max_batch = config.batch_size
        cache = PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=1, page_size=config.page_size,
                             policy=config.kv_policy, max_seq_len=max_seq_len, max_batch=self.max_batch,
                             dtype=torch.float32, pool_tokens=self.max_batch * max_seq_len)
        self.scheduler = Scheduler(cache, self.max_batch, configured_chunk(config))
        self.compiled = config.fusion_level != "O0"
        self.buckets = batch_buckets(self.max_batch)
        self.max_seq_len = max_seq_len
        # The engine's decode steps read only their rows' pages on the CPU (engine/build.py), the whole context on
        # an accelerator, whose captured graphs want one shape.
        self.dynamic_context = profile.name.startswith("cpu")
        self._seconds: dict[tuple[int, int, int], float] = {}

    # -- the forwards' times ---------------------------------------------------------------------------------------
    def _forward(self, rows: int, new_tokens: int, context: int) -> float:
        """Seconds of one forward; the context is counted in whole pages, as paged attention reads them."""
        page = self.config.page_size
        context = -(-context // page) * page
        key = (rows, new_tokens, context)
        if key not in self._seconds:
            c = self.config
            cost = step_cost(self.spec, c.quant, c.fusion_level == "O2", rows, new_tokens, float(context), page,
                             c.dtype)
            self._seconds[key] = step_seconds(cost, self.spec, c, self.profile, rows)[0]
        return self._seconds[key]

    def _emit(self, seqs: list[Sequence]) -> None:
        for s in seqs:
            s.append(_TOKEN, self.clock.now)

    def _now(self) -> float:
        return self.clock.now

    def _prefill(self, batch: PrefillBatch) -> None:
        if batch.end is None:
            for group in length_groups(batch.seqs):
                width = max(max(s.prompt_len for s in group), 2 if self.compiled else 1)
                self.clock.sleep(self._forward(len(group), width, 0))
                for s in group:
                    s.length = s.prompt_len
                self._emit(group)
            return
        seq = batch.seqs[0]
        self.clock.sleep(self._forward(1, batch.end - seq.length, seq.length))
        seq.length = batch.end
        if seq.length == seq.prompt_len:
            self._emit([seq])

    def _decode(self, seqs: list[Sequence]) -> None:
        rows = next(b for b in self.buckets if b >= len(seqs)) if self.compiled else len(seqs)
        context = max(s.length for s in seqs) + 1 if self.dynamic_context else self.max_seq_len
        for s in seqs:
            self.scheduler.cache.extend(s.seq_id, s.length + 1)
        self.clock.sleep(self._forward(rows, 1, context))
        for s in seqs:
            s.length += 1
        self._emit(seqs)

    def warm_up(self) -> None:
        """Nothing to compile: a simulated engine is warm."""


def _prompt_lengths(workload: Workload) -> list[int]:
    """Prompt lengths drawn uniformly from the workload's range (bench_prompts cuts real text to lengths drawn so)."""
    rng = random.Random(f"sim-prompts:{workload.seed}")
    return [rng.randint(workload.prompt_min, workload.prompt_max) for _ in range(workload.num_requests)]


def _simulate(spec: ModelSpec, config: DeployConfig, profile: HardwareProfile, workload: Workload,
              slo: Slo) -> OpenLoopRun:
    clock = VirtualClock()
    runner = SimulatedRunner(spec, config, profile, workload.max_seq_len, clock)
    load = load_requests(workload, [[1] * n for n in _prompt_lengths(workload)])
    return run_open_loop(runner, load, slo, workload.rate, clock=clock, sleep=clock.sleep)


def predict_goodput(spec: ModelSpec, config: DeployConfig, workload: Workload, profile: HardwareProfile,
                    slo: Slo) -> dict:
    """The goodput a trial would measure (benchmark/goodput.measure_goodput's figures), predicted: the same rate
    search from the predicted offline throughput, each rate a simulated open-loop run of SIM_PROBE_REQUESTS requests
    (one draw of arrivals for every rate, so that attainment falls with the rate alone). `config` is an engine
    configuration (sim/stand_in.py gives one for another runtime's); labelled `simulated`."""
    probe = goodput_workload(workload, 1.0, SIM_PROBE_REQUESTS)
    mean_out = probe.mean_output_tokens
    start = predict(spec, config, workload, profile).throughput_tok_s / mean_out
    clock = VirtualClock()

    def measure(rate: float) -> OpenLoopRun:
        run = _simulate(spec, config, profile, replace(probe, rate=rate), slo)
        clock.sleep(run.seconds)
        return run

    out = find_goodput(measure, start, slo, budget_s=float("inf"), clock=clock, report=None)
    out["goodput_tok_s"] = out["goodput_req_s"] * mean_out
    out["workload"] = {**probe.to_dict(), "rate": "searched"}
    out["simulated"] = True
    del out["seconds"], out["budget_s"]  # virtual time: the search spent none of a budget
    return out
