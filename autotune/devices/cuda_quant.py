"""The CUDA device's own quantizers: torchao's int4 weight-only in the layout CUDA's int4 kernel reads, with a group
size per layer; torchao's int8 activations with their rows padded for cuBLAS's int8 GEMM (engine/int_mm.py).
(w8a16 needs neither: torchao's config picks CUDA kernels by the weight's device.)"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from autotune.engine.int4 import pick_group_size
from autotune.engine.int_mm import RowPadded
from autotune.engine.quant import QUANTIZERS, W8A8, Quantizer, TorchAOQuantizer
from autotune.errors import TrialFailure

__all__ = ["CudaW4A16", "CudaW8A8", "CUDA_QUANTIZERS", "group_sizes"]


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


class CudaW8A8(W8A8):
    """torchao's dynamic int8 activations and int8 weights, each converted linear wrapped in RowPadded: compiled,
    its matmul is aten._int_mm, which cuBLAS runs only on more than 16 rows (a decode step of batch <= 16 has
    fewer)."""

    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None:
        targets = [name for name, module in model.named_modules() if select(module, name)]
        super().apply(model, select)
        for name in targets:
            parent, _, attr = name.rpartition(".")
            owner = model.get_submodule(parent)
            setattr(owner, attr, RowPadded(getattr(owner, attr)))


# Scheme -> the quantizer CUDA builds it with (the others as on the CPU).
CUDA_QUANTIZERS: dict[str, type[Quantizer]] = {**QUANTIZERS, "w8a8": CudaW8A8, "w4a16": CudaW4A16}
