"""The CUDA device's own quantizer: torchao's int4 weight-only in the layout CUDA's int4 kernel reads. (The int8
schemes need none: torchao's configs pick CUDA kernels by the weight's device.)"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from autotune.engine.int4 import pick_group_size
from autotune.engine.quant import TorchAOQuantizer
from autotune.errors import TrialFailure

__all__ = ["CudaW4A16", "group_sizes"]


def group_sizes(targets: dict[str, nn.Module]) -> dict[int, set[str]]:
    """Group size -> the layers that use it: 128 input columns where that divides the width, else 64 or 32, as the
    CPU path (engine/int4.py) picks them. One size for all would have torchao skip, with a log line only, every
    layer whose width it does not divide (on SmolLM2, width 576, every layer but down_proj)."""
    out: dict[int, set[str]] = {}
    for name, module in targets.items():
        try:
            size = pick_group_size(module.in_features)
        except ValueError as exc:
            raise TrialFailure(f"int4 on CUDA cannot quantize {name}: {exc}") from exc
        out.setdefault(size, set()).add(name)
    return out


class CudaW4A16(TorchAOQuantizer):
    """torchao int4 weight-only, groups of 128 (64 or 32 where 128 does not divide the width), tinygemm's
    tile-packed layout (the gpt-fast kernel, aten._weight_int4pack_mm on CUDA; the default "plain" layout needs
    the mslk package)."""

    weight_bits = 4

    def config(self, group_size: int = 128):
        from torchao.quantization import Int4WeightOnlyConfig

        return Int4WeightOnlyConfig(group_size=group_size, int4_packing_format="tile_packed_to_4d")

    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None:
        from torchao.quantization import quantize_

        targets = {name: module for name, module in model.named_modules() if select(module, name)}
        for size, names in sorted(group_sizes(targets).items()):
            try:
                quantize_(model, self.config(size), filter_fn=lambda m, fqn, names=names: fqn in names)
            except (RuntimeError, ImportError, NotImplementedError, ValueError) as exc:
                raise TrialFailure(f"torchao int4 (group {size}) cannot be applied here: {exc}") from exc
