"""The runner `autotune serve`'s engine loop drives (serve/engine_loop.py), made here so that a trial's goodput
search (trial/run.py) drives the same one without reaching up into the server."""
from __future__ import annotations

from autotune.engine.build import Engine
from autotune.engine.runner import Runner

__all__ = ["PREFILL_CHUNK", "serving_runner"]

# Prompt tokens one engine step may prefill: new prompts delay the running decodes by one forward of at most this
# many tokens a step, instead of all admitted prompts at once (8 prompts of 128 tokens in one forward).
PREFILL_CHUNK = 256


def serving_runner(engine: Engine, max_seq_len: int, prefill_chunk: int | None = PREFILL_CHUNK) -> Runner:
    """The recipe's batch, a pool of batch * max_seq_len tokens, decode in batch buckets, prompts prefilled in
    chunks beside running decodes."""
    batch = engine.config.batch_size
    return engine.runner(max_seq_len=max_seq_len, pool_tokens=batch * max_seq_len, prefill_chunk=prefill_chunk,
                         bucketed=True)
