"""What the gate and the benchmark ask of a peer engine with one configuration (llama.cpp's context, OpenVINO's
pipeline): one protocol, so that both are gated and measured by the same code as autotune's own engine."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from autotune.engine.sequence import Completion, Request

__all__ = ["PeerRunner", "StepRunner"]


class PeerRunner(Protocol):
    """`config`, a DeployConfig; `run(requests)`, every request to its end through the engine's continuous batching
    (forced requests emit their forced tokens and record the engine's greedy choice at each step); `all_logits(
    tokens)`, one sequence's teacher-forced logits at every position, [len(tokens), vocab] float32."""

    config: object

    def run(self, requests: list[Request]) -> list[Completion]: ...

    def all_logits(self, tokens: list[int]) -> np.ndarray: ...


class StepRunner(Protocol):
    """What the server's engine loop drives (autotune/serve/engine_loop.py): autotune's engine runner and OpenVINO's
    pipeline alike. `submit(request, arrival)` queues a request and returns its Completion, filled in as `step()`
    runs (a caller cancels it by setting its `finish_reason`); `step()` runs one scheduler step and returns the
    completions that finished or were cancelled in it; `num_waiting`, `num_running`: requests queued and in the
    running batch; `max_batch`: the most sequences run together; `kv_usage()`: (KV pages or blocks in use,
    allocated); `warm_up()`: run what the first requests would otherwise pay for (compiles, first allocations)."""

    max_batch: int

    def submit(self, request: Request, arrival: float | None = None) -> Completion: ...

    def step(self) -> list[Completion]: ...

    @property
    def num_waiting(self) -> int: ...

    @property
    def num_running(self) -> int: ...

    def kv_usage(self) -> tuple[int, int]: ...

    def warm_up(self) -> None: ...
