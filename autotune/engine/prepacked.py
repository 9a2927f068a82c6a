"""fp32 linear layers through oneDNN with their weights reordered once, at build, into its blocked layout.

aten's fp32 matmul (MKL sgemm) reads a row-major weight on every call; at decode shapes (a few rows against a
weight far larger than the caches) that streams the weights at a fraction of the memory bandwidth; oneDNN with the
weight prepacked once runs the same decode-shaped matmuls about twice as fast (docs/measurements.md, "AMD EPYC Zen
3, AVX2 only"). The blocked weight is an opaque oneDNN tensor that inductor accepts only as a
frozen constant, so this is the eager (O0) path; O2's freezing prepacks for itself."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["PrepackedLinear", "prepack_available", "prepack_linears"]


def prepack_available() -> bool:
    return bool(torch.backends.mkldnn.is_available())


class PrepackedLinear(nn.Module):
    """y = x @ W.T + b with W held in oneDNN's layout (reordered for `rows_hint` rows: the decode batch)."""

    def __init__(self, linear: nn.Linear, rows_hint: int) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        # An opaque tensor (layout torch._mkldnn): kept as a plain attribute, not a buffer, so that state_dict,
        # .to() and the weight accounting never try to read it as a strided tensor.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows_hint)
        self.nbytes = weight.numel() * weight.element_size()
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


def prepack_linears(model: nn.Module, select, rows_hint: int) -> int:
    """Replace every fp32 nn.Linear that `select(module, fqn)` picks; returns how many were replaced."""
    targets = [(fqn, m) for fqn, m in model.named_modules()
               if isinstance(m, nn.Linear) and m.weight.dtype == torch.float32 and select(m, fqn)]
    for fqn, module in targets:
        parent, _, attr = fqn.rpartition(".")
        setattr(model.get_submodule(parent), attr, PrepackedLinear(module, rows_hint))
    return len(targets)
