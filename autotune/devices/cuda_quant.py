"""The CUDA device's own quantizer: torchao's int4 weight-only in the layout CUDA's int4 kernel reads. (The int8
schemes need none: torchao's configs pick CUDA kernels by the weight's device.)"""
from __future__ import annotations

from autotune.engine.quant import TorchAOQuantizer

__all__ = ["CudaW4A16"]


class CudaW4A16(TorchAOQuantizer):
    """torchao int4 weight-only, groups of 128, tinygemm's tile-packed layout (the gpt-fast kernel,
    aten._weight_int4pack_mm on CUDA; the default "plain" layout needs the mslk package)."""

    weight_bits = 4

    def config(self):
        from torchao.quantization import Int4WeightOnlyConfig

        return Int4WeightOnlyConfig(group_size=128, int4_packing_format="tile_packed_to_4d")
