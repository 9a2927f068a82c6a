"""Rows padded for CUDA's int8 GEMM. torch._int_mm on CUDA (cuBLASLt) refuses an input of 16 rows or fewer
("self.size(0) needs to be greater than 16"), and torchao's int8-activation linears reach it whenever they are
compiled: its `safe_int_mm` emits out_dtype(mm, int32), which lowers to aten._int_mm on CUDA. A decode step has
one row per sequence, so every batch of 16 or fewer would fail. The rows are padded with zeros to 17 and the
padding cut from the result: activation scales are per token (dynamic) or one per tensor from calibration
(static), so a zero row changes no other row's result."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["INT_MM_MIN_ROWS", "pad_rows", "RowPadded"]

INT_MM_MIN_ROWS = 17


def pad_rows(x: torch.Tensor, min_rows: int = INT_MM_MIN_ROWS) -> torch.Tensor:
    """x [rows, in] with zero rows appended up to `min_rows` (x itself when it has enough)."""
    rows = x.shape[0]
    return x if rows >= min_rows else F.pad(x, (0, 0, 0, min_rows - rows))


class RowPadded(nn.Module):
    """y = inner(x) with the input seen as [rows, in] and padded to INT_MM_MIN_ROWS rows; `inner` is a linear
    whose int8 matmul needs them (named `inner` so that the coverage check looks through it)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # [tokens, in]
        out = self.inner(pad_rows(rows))[: rows.shape[0]]
        return out.view(*x.shape[:-1], out.shape[-1])
