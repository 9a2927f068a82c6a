"""One pass of the fp32 reference model over the calibration set, reading the input of every decoder linear layer:
per input channel max |x| and mean |x|, and x^T x (the Gram matrix AWQ's search scores candidates with).

The engine fuses q/k/v and gate/up into one linear each; their inputs are the inputs of transformers' q_proj and
gate_proj, so the statistics are taken there and named as the engine names its layers ("layers.3.qkv_proj")."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["HF_INPUTS", "LayerStats", "collect_statistics", "fused_weight"]

# The engine's linear -> the transformers module (in each decoder layer) whose input it takes.
HF_INPUTS = {"qkv_proj": "self_attn.q_proj", "o_proj": "self_attn.o_proj", "gate_up_proj": "mlp.gate_proj",
             "down_proj": "mlp.down_proj"}
_FUSED = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "o_proj": ("self_attn.o_proj",), "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
          "down_proj": ("mlp.down_proj",)}


@dataclass
class LayerStats:
    """One layer's input over the calibration set: absmax, mean_abs [in]; gram [in, in] (sum of x x^T)."""

    absmax: torch.Tensor
    abs_sum: torch.Tensor
    rows: int = 0
    gram: torch.Tensor | None = field(default=None, repr=False)

    @property
    def mean_abs(self) -> torch.Tensor:
        return self.abs_sum / max(self.rows, 1)

    def add(self, x: torch.Tensor, with_gram: bool) -> None:
        x = x.reshape(-1, x.shape[-1]).float()  # [tokens, in]
        self.absmax = torch.maximum(self.absmax, x.abs().amax(0))
        self.abs_sum += x.abs().sum(0)
        self.rows += x.shape[0]
        if with_gram:
            self.gram = x.T @ x if self.gram is None else self.gram.addmm_(x.T, x)


def fused_weight(hf_model: nn.Module, name: str) -> torch.Tensor:
    """The fp32 weight [out, in] of the engine's layer `name` ("layers.3.qkv_proj"), fused as the engine fuses it."""
    _, index, proj = name.split(".")
    layer = hf_model.model.layers[int(index)]
    return torch.cat([layer.get_submodule(part).weight.detach().float() for part in _FUSED[proj]])


@torch.inference_mode()
def collect_statistics(hf_model: nn.Module, samples: list[list[int]], *, with_gram: bool = True,
                       batch_size: int = 16) -> dict[str, LayerStats]:
    """hf_model: transformers' LLaMA in fp32. Runs the decoder stack (not the head: no logits are needed) over
    the samples, `batch_size` at a time, and returns each decoder linear layer's LayerStats by engine name."""
    stats: dict[str, LayerStats] = {}
    handles = []
    for index, layer in enumerate(hf_model.model.layers):
        for proj, path in HF_INPUTS.items():
            name = f"layers.{index}.{proj}"
            width = layer.get_submodule(path).in_features
            stats[name] = LayerStats(torch.zeros(width), torch.zeros(width))

            def hook(module, args, output, name=name) -> None:
                stats[name].add(args[0], with_gram)

            handles.append(layer.get_submodule(path).register_forward_hook(hook))
    try:
        for i in range(0, len(samples), batch_size):
            hf_model.model(input_ids=torch.tensor(samples[i:i + batch_size]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return stats
