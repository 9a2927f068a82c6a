"""Int4 weight-only linear for the CPU: PyTorch's own packed-int4 kernel (_weight_int4pack_mm_for_cpu).

torchao's Int4WeightOnlyConfig needs kernels this CPU build lacks (it failed with `Requires mslk >= 1.0.0`), so the
same scheme (asymmetric, per group along the input dimension, tinygemm's zero-point convention) is built here."""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["Int4Linear", "fake_quantize_int4", "pick_group_size", "quantize_groups"]


def pick_group_size(in_features: int, preferred: int = 128) -> int:
    """The largest of preferred, preferred/2, ... (down to 32) that divides in_features."""
    size = preferred
    while size >= 32:
        if in_features % size == 0:
            return size
        size //= 2
    raise ValueError(f"no int4 group size in [32, {preferred}] divides {in_features}")


def quantize_groups(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """weight [out, in] -> (codes int32 [out, in] in 0..15, scale and lo [out, in / group_size, 1]): each group
    of `group_size` input columns maps its [min, max] onto the 16 codes; w ~= codes * scale + lo."""
    weight = weight.detach().float()
    out_features, in_features = weight.shape
    groups = weight.view(out_features, in_features // group_size, group_size)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (hi - lo).clamp(min=1e-6) / 15
    codes = ((groups - lo) / scale).round().clamp(0, 15).to(torch.int32).view(out_features, in_features)
    return codes, scale, lo


def fake_quantize_int4(weight: torch.Tensor, group_size: int) -> torch.Tensor:
    """What Int4Linear computes with, in fp32: the weight rounded to its group's 16 levels (AWQ's search scores
    candidate scales with it)."""
    codes, scale, lo = quantize_groups(weight, group_size)
    out_features, in_features = codes.shape
    return (codes.view(out_features, -1, group_size).float() * scale + lo).view(out_features, in_features)


class Int4Linear(nn.Module):
    """y = x @ dequant(W).T with W stored as 4-bit codes, `group_size` columns sharing a scale and zero."""

    def __init__(self, linear: nn.Linear, group_size: int = 128) -> None:
        super().__init__()
        out_features, in_features = linear.weight.shape
        self.in_features, self.out_features = in_features, out_features
        self.group_size = pick_group_size(in_features, group_size)
        codes, scale, lo = quantize_groups(linear.weight, self.group_size)
        # tinygemm dequantises as (code - 8) * scale + zero, so zero is the value of code 8.
        zero = lo + 8 * scale
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2))
        # scales_and_zeros: [in / group_size, out, 2]
        scales_and_zeros = torch.stack([scale.squeeze(-1).t(), zero.squeeze(-1).t()], dim=-1)
        self.register_buffer("scales_and_zeros", scales_and_zeros.to(linear.weight.dtype).contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(x.reshape(-1, shape[-1]), self.packed, self.group_size,
                                                          self.scales_and_zeros)
        return out.view(*shape[:-1], self.out_features)
