"""The runner `autotune serve`'s engine loop drives (serve/engine_loop.py), made here so that a trial's goodput
search (trial/run.py) drives the same one without reaching up into the server."""
from __future__ import annotations

from autotune.engine.build import Engine
from autotune.engine.runner import Runner

__all__ = ["PREFILL_CHUNK", "serving_runner", "configured_chunk"]

# Prompt tokens one engine step may prefill where a configuration does not say (EngineKnobs.prefill_chunk's
# default): new prompts delay the running decodes by one forward of at most this many tokens a step, instead of all
# admitted prompts at once (8 prompts of 128 tokens in one forward).
PREFILL_CHUNK = 256


def configured_chunk(config) -> int | None:
    """The configuration's prefill chunk for Runner (None: whole prompts); the default for a runtime without the
    knob, whose runner schedules prompts its own way (OpenVINO's pipeline ignores it)."""
    chunk = getattr(config.knobs, "prefill_chunk", PREFILL_CHUNK)
    return chunk or None


def serving_runner(engine: Engine, max_seq_len: int, prefill_chunk: int | None = None) -> Runner:
    """The recipe's batch, a pool of batch * max_seq_len tokens, decode in batch buckets, prompts prefilled in
    chunks of the configuration's `prefill_chunk` beside running decodes (`prefill_chunk` given: that instead)."""
    batch = engine.config.batch_size
    chunk = configured_chunk(engine.config) if prefill_chunk is None else prefill_chunk
    return engine.runner(max_seq_len=max_seq_len, pool_tokens=batch * max_seq_len, prefill_chunk=chunk,
                         bucketed=True)
