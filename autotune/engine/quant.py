"""Quantizers: each turns the decoder layers' linear weights into one scheme's representation, in place. Also what
every scheme is checked by: the decoder linear layers by name, which of them were converted, and the bytes of
the weights."""
from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

from autotune.engine.int4 import Int4Linear
from autotune.errors import TrialFailure

__all__ = ["Quantizer", "TorchAOQuantizer", "Baseline", "QUANTIZERS", "decoder_linear", "quantize_model",
           "decoder_linear_names", "is_converted", "check_coverage", "weight_bytes"]


class Quantizer(ABC):
    """Contract: `apply` replaces the weights of every linear layer that `select` picks, in place, and leaves
    the module callable with the same inputs and output dtype. It raises TrialFailure when this build of
    the libraries cannot run the scheme on the CPU (the reason says which library and why)."""

    weight_bits: int = 16
    activation_bits: int = 16

    @abstractmethod
    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None: ...


class Baseline(Quantizer):
    """No quantization: weights stay in the compute dtype."""

    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None:
        return None


class TorchAOQuantizer(Quantizer):
    """A scheme that is one torchao config: subclasses give `config()`, applied with `quantize_`."""

    def config(self):
        raise NotImplementedError

    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None:
        from torchao.quantization import quantize_

        try:
            quantize_(model, self.config(), filter_fn=select)
        except (RuntimeError, ImportError, NotImplementedError, ValueError) as exc:
            raise TrialFailure(f"torchao {type(self).__name__} cannot be applied here: {exc}") from exc


class W8A16(TorchAOQuantizer):
    """torchao int8 weight-only, per output channel; activations stay in the compute dtype."""

    weight_bits = 8

    def config(self):
        from torchao.quantization import Int8WeightOnlyConfig

        return Int8WeightOnlyConfig()


class W8A8(TorchAOQuantizer):
    """torchao dynamic int8 activations (per token) and int8 weights (per channel)."""

    weight_bits = 8
    activation_bits = 8

    def config(self):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig

        return Int8DynamicActivationInt8WeightConfig()


class W4A16(Quantizer):
    """Int4 weight-only, groups of 128 input columns (64 or 32 where 128 does not divide the width), on
    PyTorch's packed-int4 CPU kernel; activations stay in the compute dtype."""

    weight_bits = 4

    def apply(self, model: nn.Module, select: Callable[[nn.Module, str], bool]) -> None:
        targets = [(name, module) for name, module in model.named_modules() if select(module, name)]
        try:
            for name, module in targets:
                parent_name, _, attr = name.rpartition(".")
                setattr(model.get_submodule(parent_name), attr, Int4Linear(module))
        except (RuntimeError, ValueError) as exc:
            raise TrialFailure(f"int4 weight packing failed on this CPU build: {exc}") from exc


QUANTIZERS: dict[str, type[Quantizer]] = {"none": Baseline, "w8a16": W8A16, "w8a8": W8A8, "w4a16": W4A16}


def decoder_linear(module: nn.Module, fqn: str) -> bool:
    # Embedding and lm_head (tied to it) stay in the compute dtype, as torchao's LLaMA recipes leave them.
    return isinstance(module, nn.Linear) and ".layers." in f".{fqn}" and "lm_head" not in fqn


def quantize_model(model: nn.Module, scheme: str) -> None:
    QUANTIZERS[scheme]().apply(model, decoder_linear)


_SEGMENT_LAYER = re.compile(r"(?:^|\.)segments\.(\d+)\.layers\.(\d+)\.(\w+)$")


def decoder_linear_names(model: nn.Module) -> dict[str, str]:
    """Module path -> the layer's name independent of how the layers are split into segments: "layers.3.down_proj"
    for the engine's segments.S.layers.I.down_proj (I counted within segment S). Fallback lists, sensitivity and
    recipes use these names; other models keep their module paths."""
    out = {}
    for fqn, module in model.named_modules():
        if not decoder_linear(module, fqn):
            continue
        match = _SEGMENT_LAYER.search(fqn)
        if match and hasattr(model, "segments"):
            first = model.segments[int(match[1])].first_layer
            out[fqn] = f"layers.{first + int(match[2])}.{match[3]}"
        else:
            out[fqn] = fqn
    return out


def is_converted(module: nn.Module) -> bool:
    """Whether a decoder linear slot holds a quantized representation: anything but a plain nn.Linear whose weight
    is an ordinary floating-point tensor (torchao keeps nn.Linear but swaps the weight for its tensor subclass).
    Wrappers that scale the input first (`inner`) are looked through."""
    while hasattr(module, "inner"):
        module = module.inner
    if not isinstance(module, nn.Linear):
        return True
    return type(module.weight.data) is not torch.Tensor or not module.weight.dtype.is_floating_point


def check_coverage(model: nn.Module, scheme: str, names: dict[str, str], kept: set[str]) -> dict:
    """After quantizing: every decoder linear layer (`names`: module path -> layer name, taken before) is converted
    except those `kept` in the compute dtype, which must still be plain. A scheme applied to fewer layers than it
    claims (a library that skips a layer whose width does not suit it, with a log line only) fails the trial."""
    if scheme == "none":
        return {"decoder_linear_layers": len(names), "converted": 0, "kept": []}
    modules = dict(model.named_modules())
    converted = sorted(name for fqn, name in names.items() if is_converted(modules[fqn]))
    skipped = sorted(name for name in names.values() if name not in kept and name not in converted)
    quantized_kept = sorted(name for name in converted if name in kept)
    if skipped or quantized_kept:
        what = (f"{len(skipped)} of {len(names) - len(kept)} decoder linear layers it should convert were left "
                f"unquantized (e.g. {', '.join(skipped[:4])})" if skipped else
                f"layers meant to stay in the compute dtype were quantized: {', '.join(quantized_kept[:4])}")
        raise TrialFailure(f"{scheme} was applied to fewer layers than it claims: {what}")
    return {"decoder_linear_layers": len(names), "converted": len(converted), "kept": sorted(kept)}


def _tensor_bytes(tensor: torch.Tensor) -> list[tuple[int, int]]:
    """(data pointer, bytes) of a tensor, or of the plain tensors inside a tensor subclass (torchao's)."""
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return [item for name in names for item in _tensor_bytes(getattr(tensor, name))]
    return [(tensor.data_ptr(), tensor.numel() * tensor.element_size())]


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the parameters and persistent buffers (packed codes, scales), each storage counted once (the tied
    embedding and head are one tensor)."""
    seen: dict[int, int] = {}
    persistent = {name for name, _ in model.named_buffers()} - {
        f"{prefix}{'.' if prefix else ''}{name}" for prefix, module in model.named_modules()
        for name in getattr(module, "_non_persistent_buffers_set", ())}
    tensors = [p for _, p in model.named_parameters()] + [b for name, b in model.named_buffers() if name in persistent]
    for tensor in tensors:
        for ptr, size in _tensor_bytes(tensor):
            seen[ptr] = max(seen.get(ptr, 0), size)
    # Weights held in oneDNN's opaque layout (engine/prepacked.py) are no parameter: they state their own size.
    return sum(seen.values()) + sum(getattr(m, "nbytes", 0) for m in model.modules() if hasattr(m, "packed"))
