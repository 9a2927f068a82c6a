"""The quantize step with its method and per-layer fallback: round-to-nearest, SmoothQuant (static or dynamic
activation scales) or AWQ over a scheme's quantizer, with the most sensitive layers kept in the compute dtype.

The statistics come from the calibration set (autotune/quant builds a QuantPlan from it). SmoothQuant and AWQ are
torchao's algorithms, applied as torchao applies them (the weight scaled per input channel, quantized by the
scheme's own quantizer, the activation multiplied by the reciprocal first: torchao's `act_pre_scale`), with two
changes for this engine and this CPU: the statistics are read from the calibration pass cached per model instead
of observers re-run at every build, and AWQ's search scores each candidate over all calibration positions through
their Gram matrix with the int4 kernel's own rounding (autotune/quant/awq.py), since torchao's AWQ needs a torchao
int4 tensor that keeps every input, seconds per layer at the calibration set's size and several times that in
fp32."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch
from torch import nn

from autotune.config.calibration import SMOOTHQUANT_ALPHA
from autotune.engine.int_mm import pad_rows
from autotune.engine.quant import QUANTIZERS, Quantizer, check_coverage, decoder_linear, decoder_linear_names
from autotune.errors import TrialFailure

__all__ = [
    "METHODS",
    "SMOOTHQUANT_ALPHA",
    "Method",
    "PreScaled",
    "QuantPlan",
    "StaticInt8Linear",
    "quantize_layers",
    "smoothing_factor",
    "static_activation_scale",
]


@dataclass(frozen=True)
class QuantPlan:
    """What a calibrated method or a per-layer fallback needs beyond the scheme, by layer name ("layers.3.down_proj",
    see decoder_linear_names): the layers `keep` in the compute dtype (most sensitive first), each layer's input
    statistic per input channel over the calibration set (`act_absmax`: max |x|, for SmoothQuant) and AWQ's
    searched scales (`awq_scales`). `summary` is what the trial reports (calibration provenance, sensitivity)."""

    keep: tuple[str, ...] = ()
    act_absmax: dict[str, torch.Tensor] = field(default_factory=dict)
    awq_scales: dict[str, torch.Tensor] = field(default_factory=dict)
    summary: dict = field(default_factory=dict)


class PreScaled(nn.Module):
    """y = inner(x * inv_scale): the activation side of a per-input-channel scale migrated into the weight
    (SmoothQuant's smoothing factor, AWQ's scale); torchao's `act_pre_scale`, as a module so that it wraps any
    device's quantized linear."""

    inv_scale: torch.Tensor  # [in], in the compute dtype

    def __init__(self, inner: nn.Module, inv_scale: torch.Tensor) -> None:
        super().__init__()
        self.inner = inner
        self.register_buffer("inv_scale", inv_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x * self.inv_scale)


class StaticInt8Linear(nn.Module):
    """int8 weights (per output channel) and int8 activations with one static scale from calibration, as Ascend's
    W8A8 deploys: torchao's Int8StaticActivationInt8WeightConfig. torchao wants the scale with the input's rank, so
    inputs are seen as 2-D ([tokens, in]) whatever the step (prefill 3-D, decode 2-D)."""

    def __init__(self, linear: nn.Linear, act_scale: torch.Tensor) -> None:
        super().__init__()
        from torchao.quantization import Int8StaticActivationInt8WeightConfig, quantize_
        from torchao.quantization.granularity import PerRow, PerTensor

        config = Int8StaticActivationInt8WeightConfig(act_quant_scale=act_scale.float().reshape(1, 1),
                                                      granularity=[PerTensor(), PerRow()], set_inductor_config=False)
        holder = nn.ModuleDict({"linear": linear})
        try:
            quantize_(holder, config, filter_fn=lambda m, _: m is linear)
        except (RuntimeError, ImportError, NotImplementedError, ValueError) as exc:
            raise TrialFailure(f"torchao's static int8 activations cannot be applied here: {exc}") from exc
        self.inner = holder["linear"]
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        # On CUDA its int8 matmul takes more than 16 rows only (engine/int_mm.py); the padding is cut off again.
        out = self.inner(pad_rows(rows) if rows.is_cuda else rows)[: rows.shape[0]]
        return out.view(*x.shape[:-1], self.out_features)


def smoothing_factor(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float = SMOOTHQUANT_ALPHA) -> torch.Tensor:
    """SmoothQuant's per-input-channel factor s = max|X|^alpha / max|W|^(1-alpha) (torchao's SmoothQuantObserver):
    X / s is easier to quantize, W * s a little harder. act_absmax [in]; weight [out, in]."""
    eps = torch.finfo(torch.float32).eps
    w_absmax = weight.detach().float().abs().amax(dim=0)
    return (act_absmax.float() + eps).pow(alpha) / (w_absmax + eps).pow(1 - alpha)


def static_activation_scale(act_absmax: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """One symmetric int8 scale for the smoothed activations X / s over the calibration set: their largest |value|
    (max over channels of max|X_j| / s_j) over 127.5, torchao's symmetric formula."""
    return (act_absmax.float() / factor).amax() / 127.5


def _replace_one(quantizer: Quantizer, linear: nn.Linear) -> nn.Module:
    """`linear` as the scheme's quantizer converts it (any quantizer, any device)."""
    holder = nn.ModuleDict({"linear": linear})
    quantizer.apply(holder, lambda m, _: m is linear)
    return holder["linear"]


def _scaled(linear: nn.Linear, scale: torch.Tensor) -> tuple[nn.Linear, torch.Tensor]:
    """(a copy of `linear` with its weight times `scale` per input channel, the reciprocal for the activations).
    The reciprocal is rounded to the compute dtype first and the weight scaled by its exact inverse, so that the
    pair cancels: (x / s) (W s)^T = x W^T up to the quantization."""
    dtype = linear.weight.dtype
    inv_scale = (1.0 / scale.float()).to(dtype)
    scaled = nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None, dtype=dtype,
                       device=linear.weight.device)
    with torch.no_grad():
        scaled.weight.copy_(linear.weight.float() / inv_scale.float())
        if linear.bias is not None:
            scaled.bias.copy_(linear.bias)
    scaled.requires_grad_(False)
    return scaled, inv_scale.to(linear.weight.device)


class Method(ABC):
    """Contract: `convert(linear, quantizer, plan, name)` returns the module that replaces the decoder linear layer
    `name` under the scheme's `quantizer`, computing the same function up to quantization. It raises TrialFailure
    when the plan lacks what it needs. `schemes` lists where it is meaningful (config/deploy.py QUANT_METHODS)."""

    # Reads the calibration statistics (act_absmax, awq_scales): False spares a plan the calibration pass.
    calibrated = True

    @abstractmethod
    def convert(self, linear: nn.Linear, quantizer: Quantizer, plan: QuantPlan, name: str) -> nn.Module: ...


class RoundToNearest(Method):
    """The scheme's own quantizer, data-free."""

    calibrated = False

    def convert(self, linear: nn.Linear, quantizer: Quantizer, plan: QuantPlan, name: str) -> nn.Module:
        return _replace_one(quantizer, linear)


class SmoothQuant(Method):
    """Activation outliers migrated into the weights with alpha; int8 activations then quantized per token at run
    time (dynamic, torchao's Int8DynamicActivationInt8WeightConfig) or with one static per-tensor scale from the
    calibration set (static, as Ascend's W8A8 deploys)."""

    def __init__(self, static: bool, alpha: float = SMOOTHQUANT_ALPHA) -> None:
        self.static, self.alpha = static, alpha

    def convert(self, linear: nn.Linear, quantizer: Quantizer, plan: QuantPlan, name: str) -> nn.Module:
        if name not in plan.act_absmax:
            raise TrialFailure(f"SmoothQuant has no calibration statistics for {name}")
        absmax = plan.act_absmax[name].to(linear.weight.device)
        factor = smoothing_factor(absmax, linear.weight, self.alpha)
        scaled, inv_scale = _scaled(linear, factor)
        if self.static:
            inner: nn.Module = StaticInt8Linear(scaled, static_activation_scale(absmax, 1.0 / inv_scale.float()))
        else:
            inner = _replace_one(quantizer, scaled)
        return PreScaled(inner, inv_scale)


class AWQ(Method):
    """Activation-aware weight quantization: salient input channels scaled up before the int4 rounding (scales
    searched once per model on the calibration set), the activations scaled down by the same."""

    def convert(self, linear: nn.Linear, quantizer: Quantizer, plan: QuantPlan, name: str) -> nn.Module:
        if name not in plan.awq_scales:
            raise TrialFailure(f"AWQ has no searched scales for {name}")
        scaled, inv_scale = _scaled(linear, plan.awq_scales[name].to(linear.weight.device))
        return PreScaled(_replace_one(quantizer, scaled), inv_scale)


METHODS: dict[str, Method] = {
    "rtn": RoundToNearest(),
    "smoothquant_static": SmoothQuant(static=True),
    "smoothquant_dynamic": SmoothQuant(static=False),
    "awq": AWQ(),
}


def quantize_layers(model: nn.Module, scheme: str, method: str = "rtn", plan: QuantPlan | None = None,
                    quantizer: Quantizer | None = None, fallback_layers: int = 0) -> dict:
    """The build's quantize step: every decoder linear layer but the plan's `keep` (`fallback_layers` of them)
    converted by `method` over the scheme's quantizer (this CPU's by default; a device passes its own), then the
    coverage checked (TrialFailure when a layer was skipped). Round-to-nearest with no fallback is exactly the
    plain scheme. Returns the coverage figures (layers, converted, kept)."""
    quantizer = quantizer or QUANTIZERS[scheme]()
    plan = plan or QuantPlan()
    if len(plan.keep) != fallback_layers:
        raise TrialFailure(f"fallback_layers={fallback_layers} but the plan keeps {len(plan.keep)} layers "
                           "(a fallback needs the sensitivity of the layers: autotune/quant quant_plan)")
    names = decoder_linear_names(model)
    unknown = set(plan.keep) - set(names.values())
    if unknown:
        raise TrialFailure(f"the fallback names layers this model does not have: {sorted(unknown)[:4]}")
    kept = set(plan.keep) if scheme != "none" else set()
    if method == "rtn":
        quantizer.apply(model, lambda m, fqn: decoder_linear(m, fqn) and names.get(fqn) not in kept)
    else:
        convert = METHODS[method].convert
        for fqn, name in names.items():
            if name in kept:
                continue
            parent, _, attr = fqn.rpartition(".")
            owner = model.get_submodule(parent)
            setattr(owner, attr, convert(getattr(owner, attr), quantizer, plan, name))
    return check_coverage(model, scheme, names, kept)
