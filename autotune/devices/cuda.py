"""An NVIDIA GPU through torch.cuda: inductor with CUDA graphs for O2, torchao's int8 and int4 (tinygemm) kernels,
the CUDA caching allocator's peak statistics, CUDA events for timing."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from autotune.devices.base import CompileOptions, Device, Limit
from autotune.probe.accelerators import cuda_capabilities
from autotune.probe.capabilities import Capabilities

if TYPE_CHECKING:
    from autotune.engine.quant import Quantizer

__all__ = ["CUDA_COMPILE", "CudaDevice", "cuda_unavailable", "mark_pools_static"]

# Fusion level -> torch.compile on CUDA. O1: inductor's default (Triton kernels, no CUDA graphs); O2:
# "max-autotune", which benchmarks GEMM/Triton choices and replays each graph as a CUDA graph (the per-step launch
# overhead that dominates batch-1 decode). The mode is what turns CUDA graphs on (inductor's `triton.cudagraphs`).
# A graph that writes into an input is replayed only when that input is static (cudagraph trees' rule; otherwise
# "skipping cudagraphs due to mutated inputs"): every segment writes its step's K/V into the pools it is given, so
# `compile` marks them static addresses before each call (as transformers' StaticCache marks its tensors).
# No freezing: under it dynamo turns static-address inputs into graph constants captured at compile time, guarded
# by identity, so every new pool (each runner's cache, each on_demand growth) would recompile the graph; without
# it the weights are static inputs too (parameters), which is all CUDA graphs need of them.
CUDA_COMPILE: dict[str, CompileOptions | None] = {
    "O0": None,
    "O1": CompileOptions("inductor", mode="default"),
    "O2": CompileOptions("inductor", mode="max-autotune"),
}

_INSTALL = "install a CUDA build of torch==2.13.0 (from the PyTorch wheel index for your CUDA version)"
_POWER_REASON = ("device_power on CUDA would be a board power limit (nvidia-smi -pl), which needs root and changes "
                 "the card for every user; not set by autotune")


def cuda_unavailable() -> str | None:
    """Why CUDA trials cannot run here, in one line naming what to install; None when they can."""
    import torch

    if torch.version.cuda is None:
        return f"this torch {torch.__version__} has no CUDA support: {_INSTALL}"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU "
                "(check the NVIDIA driver, nvidia-smi and CUDA_VISIBLE_DEVICES)")
    return None


def mark_pools_static(args: tuple) -> None:
    """Mark the KV pools of a segment call as static addresses (unguarded: a new pool re-records the CUDA graph,
    it does not recompile), so that a CUDA graph may write into them."""
    import torch._dynamo

    from autotune.devices.segment_calls import kv_pools

    for pool in kv_pools(args):
        torch._dynamo.mark_static_address(pool)


class CudaDevice(Device):
    name = "cuda"
    torch_device = "cuda"

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def reset_peak_memory(self) -> None:
        import torch

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int:
        import torch

        # Tensors only (weights, KV pools, activations, graph pools): what the allocator handed out at most.
        return int(torch.cuda.max_memory_allocated())

    def compile_options(self, fusion_level: str) -> CompileOptions | None:
        return CUDA_COMPILE[fusion_level]

    def compile(self, fn: Callable, fusion_level: str) -> Callable:
        options = self.compile_options(fusion_level)
        if options is None:
            return fn
        import torch
        import torch._inductor.config

        from autotune.devices.segment_calls import before_each_call

        torch._inductor.config.freezing = options.freezing
        return before_each_call(torch.compile(fn, mode=options.mode), mark_pools_static)

    def quantizer(self, scheme: str) -> Quantizer:
        # torchao's int8 configs dispatch to CUDA kernels by the weight's device; int4 needs its CUDA layout and
        # int8 activations their rows padded (autotune/devices/cuda_quant.py).
        from autotune.devices.cuda_quant import CUDA_QUANTIZERS

        return CUDA_QUANTIZERS[scheme]()

    def limits(self) -> list[Limit]:
        return [Limit("device_power", None, _POWER_REASON)]

    def capabilities(self) -> Capabilities:
        import torch

        return cuda_capabilities(torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0)))

    def elapsed_s(self, fn: Callable[[], object]) -> float:
        """Seconds `fn` kept the GPU busy, from CUDA events around it."""
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
