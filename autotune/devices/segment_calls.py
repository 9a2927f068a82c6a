"""What a device's compile wrapper reads from the arguments of a compiled entry: the engine compiles
`Segment.prefill` / `Segment.decode` (x, step, k_pools, v_pools) and `EngineModel.logits` (x) (engine/build.py),
and some devices must mark tensors before each call (CUDA: the KV pools' addresses; NPU: decode's static shapes)."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from autotune.engine.layers import StepInputs

__all__ = ["kv_pools", "decode_step", "before_each_call"]


def kv_pools(args: tuple) -> list[torch.Tensor]:
    """The K and V pools of a segment call (every layer's, [kv_heads, pages, page_size, head_dim]); none for the
    head's call."""
    if len(args) == 4 and isinstance(args[1], StepInputs):
        return [*args[2], *args[3]]
    return []


def decode_step(args: tuple) -> StepInputs | None:
    """The step of a segment's decode call; None for prefill and for the head."""
    if len(args) == 4 and isinstance(args[1], StepInputs) and not args[1].prefill:
        return args[1]
    return None


def before_each_call(compiled: Callable, mark: Callable[[tuple], None]) -> Callable:
    """`compiled`, with `mark(args)` run on its arguments first (outside the graph: dynamo reads the marks when it
    meets the tensors, and they cost an attribute write per tensor)."""

    # updated=(): dynamo's own attributes of `compiled` stay on it, so nothing unwraps this to the bare function
    @functools.wraps(compiled, updated=())
    def run(*args):
        mark(args)
        return compiled(*args)

    return run
