"""Quantized linear layers on Ascend through torch_npu's fused matmuls. Weight packing is plain torch (tested on
the CPU); forward calls torch_npu, imported on first use."""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from autotune.engine.quant import Baseline, Quantizer
from autotune.errors import TrialFailure

__all__ = ["quantize_weight_int8", "NpuW8A16Linear", "NpuW8A8Linear", "NPU_QUANTIZERS"]


def quantize_weight_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: weight [out, in] -> (codes int8 [out, in], scale fp32 [out]),
    weight ~= codes * scale[:, None]."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / 127
    codes = (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
    return codes, scale


def _torch_npu():
    import torch_npu

    return torch_npu


class NpuW8A16Linear(nn.Module):
    """int8 weights, bf16/fp16 activations: npu_weight_quant_batchmatmul dequantises in the kernel.
    The weight is passed as [in, out], a transposed view of a contiguous [out, in] (torch_npu's documented fast
    layout for per-channel scales)."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        codes, scale = quantize_weight_int8(linear.weight)
        self.out_features = codes.shape[0]
        self.register_buffer("codes", codes.to(linear.weight.device))  # [out, in]
        self.register_buffer("antiquant_scale", scale.to(linear.weight.dtype).to(linear.weight.device))  # [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = _torch_npu().npu_weight_quant_batchmatmul(x.reshape(-1, shape[-1]), self.codes.t(),
                                                        self.antiquant_scale)
        return out.view(*shape[:-1], self.out_features)


class NpuW8A8Linear(nn.Module):
    """int8 weights and per-token dynamic int8 activations: npu_dynamic_quant then npu_quant_matmul with the
    weight's per-channel scale and the activations' per-token scale, output in the compute dtype."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        codes, scale = quantize_weight_int8(linear.weight)
        self.out_features = codes.shape[0]
        self.out_dtype = linear.weight.dtype
        self.register_buffer("codes", codes.to(linear.weight.device))  # [out, in]
        self.register_buffer("scale", scale.to(linear.weight.device))  # fp32 [out]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        npu = _torch_npu()
        shape = x.shape
        xq, x_scale = npu.npu_dynamic_quant(x.reshape(-1, shape[-1]))  # int8 [m, in], fp32 [m]
        out = npu.npu_quant_matmul(xq, self.codes.t(), self.scale, pertoken_scale=x_scale,
                                   output_dtype=self.out_dtype)
        return out.view(*shape[:-1], self.out_features)


class _NpuReplace(Quantizer):
    linear: type[nn.Module] = nn.Module

    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None:
        targets = [(name, module) for name, module in model.named_modules() if select(module, name)]
        try:
            for name, module in targets:
                parent, _, attr = name.rpartition(".")
                setattr(model.get_submodule(parent), attr, self.linear(module))
        except (RuntimeError, ValueError) as exc:
            raise TrialFailure(f"{self.linear.__name__} cannot be built: {exc}") from exc


class NpuW8A16(_NpuReplace):
    weight_bits = 8
    linear = NpuW8A16Linear


class NpuW8A8(_NpuReplace):
    weight_bits = 8
    activation_bits = 8
    linear = NpuW8A8Linear


NPU_QUANTIZERS: dict[str, type[Quantizer]] = {"none": Baseline, "w8a16": NpuW8A16, "w8a8": NpuW8A8}
