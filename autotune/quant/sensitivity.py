"""Per-layer sensitivity: how far each decoder linear layer alone, quantized by a scheme and method, moves the
model's output distribution away from the fp32 reference's, over calibration samples.

Each layer is built as the trial builds it (the scheme's quantizer, the method's scales, the compute dtype) and run
on its own fp32 inputs; its output error dy = y_q - y is then weighed by how much the output distribution depends on
that layer's output. To second order, the KL divergence of the reference from the model with that layer quantized
is 1/2 dy^T F dy, F the Fisher information of the output distribution with respect to the layer's output; with one
label drawn from the reference's own distribution at each position, g = d log p(label) / dy gives F ~ g g^T, so
the estimate per position is 1/2 (g . dy)^2: one forward and one backward pass for all layers at once.

(The layer's own relative error ||dy|| / ||y|| was tried first and ranked the down_proj layers highest, whose
inputs are heavy-tailed; keeping 8 of them in bf16 moved SmolLM2's gate figure by less than its noise. What a
layer's error does downstream is what decides the gate.)"""
from __future__ import annotations

import torch
from torch import nn

from autotune.config.calibration import MEASURE, SENSITIVITY_SAMPLES
from autotune.engine.calibrated import METHODS, QuantPlan
from autotune.engine.quant import QUANTIZERS
from autotune.quant.stats import fused_weight, layer_parts

__all__ = ["MEASURE", "SENSITIVITY_SAMPLES", "measure_sensitivity"]



def _quantized_layer(hf_model: nn.Module, name: str, scheme: str, method: str, plan: QuantPlan,
                     dtype: torch.dtype, parts: dict[str, tuple[str, ...]]) -> tuple[torch.Tensor, nn.Module]:
    weight = fused_weight(hf_model, name, parts)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(weight)
    linear.requires_grad_(False)
    return weight, METHODS[method].convert(linear, QUANTIZERS[scheme](), plan, name)


class _Layer:
    """One engine layer during a batch: its input (kept from the forward pass) and the gradients of its parts'
    outputs (arriving in the backward pass); when all have arrived, its score for the batch is added."""

    def __init__(self, name: str, parts: int) -> None:
        self.name, self.parts = name, parts
        self.x: torch.Tensor | None = None
        self.grads: dict[int, torch.Tensor] = {}


@torch.no_grad()
def _score(layer: _Layer, weight: torch.Tensor, quantized: nn.Module, dtype: torch.dtype) -> float:
    assert layer.x is not None
    x = layer.x.reshape(-1, layer.x.shape[-1])
    dy = quantized(x.to(dtype)).float() - x @ weight.T  # [tokens, out], the parts side by side
    g = torch.cat([layer.grads[i].reshape(x.shape[0], -1) for i in range(layer.parts)], dim=-1)
    return 0.5 * float(((g * dy).sum(-1)).pow(2).sum())


def measure_sensitivity(hf_model: nn.Module, samples: list[list[int]], scheme: str, method: str, plan: QuantPlan,
                        dtype: torch.dtype = torch.bfloat16, batch_size: int = 8, seed: int = 0) -> dict[str, float]:
    """Layer name -> estimated KL (nats per position) of the reference from the model with only that layer
    quantized by `scheme` and `method` (the plan gives the method's calibration statistics), over `samples` run
    through hf_model (a transformers *ForCausalLM of a supported architecture, fp32). Larger is more sensitive."""
    parts = layer_parts(hf_model)  # which transformers modules make up each engine layer (fused or not)
    quantized = {f"layers.{index}.{proj}": _quantized_layer(hf_model, f"layers.{index}.{proj}", scheme, method, plan,
                                                             dtype, parts)
                 for index in range(len(hf_model.model.layers)) for proj in parts}
    totals = dict.fromkeys(quantized, 0.0)

    def arrived(layer: _Layer, part: int, grad: torch.Tensor) -> None:
        layer.grads[part] = grad.detach()
        if len(layer.grads) == layer.parts:  # every part's gradient is in: score the layer for this batch
            weight, module = quantized[layer.name]
            totals[layer.name] += _score(layer, weight, module, dtype)
            layer.x, layer.grads = None, {}

    def watch(layer: _Layer, part: int):
        def hook(module, args, output) -> None:
            layer.x = args[0].detach()
            output.register_hook(lambda grad: arrived(layer, part, grad))
        return hook

    generator = torch.Generator().manual_seed(seed)
    positions = 0
    params = [p for p in hf_model.parameters() if p.requires_grad]
    for p in params:
        p.requires_grad_(False)  # gradients with respect to activations only
    try:
        for i in range(0, len(samples), batch_size):
            ids = torch.tensor(samples[i:i + batch_size])
            handles = []
            for index, decoder in enumerate(hf_model.model.layers):
                for proj, paths in parts.items():
                    layer = _Layer(f"layers.{index}.{proj}", len(paths))
                    for part, path in enumerate(paths):
                        handles.append(decoder.get_submodule(path).register_forward_hook(watch(layer, part)))
            try:
                embeds = hf_model.model.embed_tokens(ids).detach().requires_grad_()
                logits = hf_model(inputs_embeds=embeds, use_cache=False).logits.float()  # [batch, seq, vocab]
                logprobs = torch.log_softmax(logits, dim=-1).reshape(-1, logits.shape[-1])
                with torch.no_grad():
                    labels = torch.multinomial(logprobs.exp(), 1, generator=generator)  # drawn from the reference
                logprobs.gather(-1, labels).sum().backward()
            finally:
                for handle in handles:
                    handle.remove()
            positions += ids.numel()
    finally:
        for p in params:
            p.requires_grad_(True)
    return {name: total / max(positions, 1) for name, total in totals.items()}
