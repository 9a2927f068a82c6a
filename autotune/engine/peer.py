"""What the gate and the benchmark ask of a peer engine with one configuration (llama.cpp's context, OpenVINO's
pipeline): one protocol, so that both are gated and measured by the same code as autotune's own engine."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from autotune.engine.sequence import Completion, Request

__all__ = ["PeerRunner"]


class PeerRunner(Protocol):
    """`config`, a DeployConfig; `run(requests)`, every request to its end through the engine's continuous batching
    (forced requests emit their forced tokens and record the engine's greedy choice at each step); `all_logits(
    tokens)`, one sequence's teacher-forced logits at every position, [len(tokens), vocab] float32."""

    config: object

    def run(self, requests: list[Request]) -> list[Completion]: ...

    def all_logits(self, tokens: list[int]) -> np.ndarray: ...
