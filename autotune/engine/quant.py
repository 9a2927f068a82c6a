"""Quantizers: each turns the decoder layers' linear weights into one scheme's representation, in place."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from torch import nn

from autotune.engine.int4 import Int4Linear
from autotune.errors import TrialFailure

__all__ = ["Quantizer", "TorchAOQuantizer", "Baseline", "QUANTIZERS", "decoder_linear", "quantize_model"]


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


QUANTIZERS: dict[str, type[Quantizer]] = {"bf16": Baseline, "w8a16": W8A16, "w8a8": W8A8, "w4a16": W4A16}


def decoder_linear(module: nn.Module, fqn: str) -> bool:
    # Embedding and lm_head (tied to it) stay in the compute dtype, as torchao's LLaMA recipes leave them.
    return isinstance(module, nn.Linear) and ".layers." in f".{fqn}" and "lm_head" not in fqn


def quantize_model(model: nn.Module, scheme: str) -> None:
    QUANTIZERS[scheme]().apply(model, decoder_linear)
