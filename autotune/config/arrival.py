"""The requests of a workload that arrives: when each comes (seeded gamma gaps, a Poisson process at burstiness 1,
as vLLM's `bench serve` draws them) and how many tokens each asks for. The same workload and seed give the same
requests at the same times."""
from __future__ import annotations

import random
from dataclasses import dataclass

from autotune.config.workload import Workload

__all__ = ["arrival_times", "gamma_arrivals", "output_lengths", "LoadRequest", "load_requests"]


def arrival_times(workload: Workload) -> list[float]:
    """Seconds from the start at which each request arrives: all at 0 offline, else `gamma_arrivals`."""
    if workload.arrival == "offline":
        return [0.0] * workload.num_requests
    return gamma_arrivals(workload.num_requests, workload.rate, workload.burstiness, workload.seed)


def gamma_arrivals(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """The running sum of gaps drawn from a gamma distribution of shape `burstiness` and scale 1/(rate *
    burstiness) (mean 1/rate), the first request at 0."""
    rng = random.Random(f"arrival:{seed}")  # its own stream: the prompts' draws do not move the times
    shape, scale = burstiness, 1.0 / (rate * burstiness)
    times, now = [], 0.0
    for _ in range(n):
        times.append(now)
        now += rng.gammavariate(shape, scale)
    return times


def output_lengths(workload: Workload) -> list[int]:
    """Each request's output tokens: `output_tokens`, or drawn uniformly from [output_min, output_tokens]."""
    if workload.output_min is None:
        return [workload.output_tokens] * workload.num_requests
    rng = random.Random(f"output:{workload.seed}")
    return [rng.randint(workload.output_min, workload.output_tokens) for _ in range(workload.num_requests)]


@dataclass(frozen=True, slots=True)
class LoadRequest:
    due: float  # seconds from the start of the run
    prompt_ids: list[int]
    new_tokens: int


def load_requests(workload: Workload, prompts: list[list[int]]) -> list[LoadRequest]:
    """The workload's requests with `prompts` (gate/corpus.bench_prompts of the same workload), in arrival order."""
    if len(prompts) != workload.num_requests:
        raise ValueError(f"{len(prompts)} prompts for a workload of {workload.num_requests} requests")
    return [LoadRequest(t, p, n) for t, p, n in zip(arrival_times(workload), prompts, output_lengths(workload))]
