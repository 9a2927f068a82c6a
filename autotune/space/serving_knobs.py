"""Knobs that only the serving path reads: the prefill chunk bounds the prompt tokens a serving step prefills beside
running decodes (serve's engine loop, and a trial's goodput probes, which drive the same runner). The offline
benchmark prefills whole prompts, so under it every value measures the same: an offline study drops them (each
trial would otherwise repeat a measurement under another name), and a study under latency objectives (`--slo`)
searches them."""
from __future__ import annotations

from autotune.space.search_space import SearchSpace, combine

__all__ = ["SERVING_KNOBS", "offline_space"]

SERVING_KNOBS = ("prefill_chunk",)
_WHY = ("only serving and the goodput probes prefill in chunks, and the offline benchmark prefills whole prompts: "
        "searched under --slo")


def offline_space(space: SearchSpace) -> SearchSpace:
    """`space` without the serving knobs (each part's, for a space over several runtimes), the reason recorded."""
    if space.parts:
        parts = tuple(offline_space(part) for part in space.parts)
        return space if parts == space.parts else combine(list(parts))
    for name in SERVING_KNOBS:
        if name in {d.name for d in space.dimensions}:
            space = space.restrict(name, (), _WHY)
    return space
