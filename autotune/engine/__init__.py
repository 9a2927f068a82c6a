"""The inference engine: a LLaMA forward on HF weights over a paged KV cache, with continuous batching."""
from __future__ import annotations

from autotune.engine.build import Engine, build_engine
from autotune.engine.runner import Runner
from autotune.engine.sequence import Completion, Request, Sampling

__all__ = ["Engine", "build_engine", "Completion", "Request", "Runner", "Sampling"]
