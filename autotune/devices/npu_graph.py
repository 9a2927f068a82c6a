"""The shapes torchair's GE graphs get from the engine: prefill one dynamic graph, decode static graphs (one per batch
bucket) whose only symbolic size is the KV pools' page count. Plain torch (no torch_npu import), so that it is
tested on any machine with a recording backend in torchair's place.

Why not torch.compile(dynamic=False): the engine marks what varies (prompt count and length, the head's rows, the
pools' pages, which grow under on_demand) with maybe_mark_dynamic, and dynamo keeps such a mark under
dynamic=False as well (a weak mark outranks assume_static_by_default), so the graphs handed to GE would be dynamic
anyway and only the unmarked sizes specialised. Ascend's own pattern is the one used here: dynamic=True, and every
input of a decode step marked static (torchair's advanced-features guide; vllm-ascend's torchair model runner marks
its decode inputs and KV caches with torch._dynamo.mark_static). The pools keep their page count symbolic: an
on_demand pool grows by half again when it runs out, and a static page count would be a new GE compile at each
growth; attention gathers pages by the block table, so its shapes stay static whatever the pool's size."""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch._dynamo

from autotune.devices.segment_calls import before_each_call, decode_step, kv_pools

__all__ = ["POOL_PAGE_DIM", "mark_decode_static", "torchair_compile"]

POOL_PAGE_DIM = 1  # pools: [kv_heads, pages, page_size, head_dim]


def mark_decode_static(args: tuple) -> None:
    """Every tensor of a decode segment call static (x, the step's tensors), the pools all but their page count;
    prefill and head calls are left as the engine marked them."""
    step = decode_step(args)
    if step is None:
        return
    torch._dynamo.mark_static(args[0])
    for name in step.__slots__:
        value = getattr(step, name)
        if isinstance(value, torch.Tensor):
            torch._dynamo.mark_static(value)
    for pool in kv_pools(args):
        torch._dynamo.mark_static(pool, [d for d in range(pool.dim()) if d != POOL_PAGE_DIM])


def torchair_compile(fn: Callable, backend: Callable, dynamic: bool) -> Callable:
    """`fn` compiled with torchair's backend (or any dynamo backend: tests record the graphs), decode calls marked
    static first."""
    return before_each_call(torch.compile(fn, backend=backend, dynamic=dynamic), mark_decode_static)
