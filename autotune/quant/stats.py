"""One pass of the fp32 reference model over the calibration set, reading the input of every decoder linear layer:
per input channel max |x| and mean |x|, and x^T x (the Gram matrix AWQ's search scores candidates with).

The engine fuses q/k/v and gate/up into one linear each. Where the checkpoint keeps them apart (LLaMA, Mistral,
Qwen, Gemma) their inputs are the inputs of transformers' q_proj and gate_proj; where it stores them fused already
(Phi-3: qkv_proj, gate_up_proj) they are those modules' inputs. Which it is comes from the architecture
(models/architectures.py), and a model whose layers lack the modules named there is refused before a pass runs.
The statistics are named as the engine names its layers ("layers.3.qkv_proj")."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from autotune.models.architectures import UnsupportedModel, check_config

__all__ = ["LayerStats", "collect_statistics", "fused_weight", "layer_parts"]

# The engine's linear -> the transformers modules (in each decoder layer) whose outputs make it up, in the engine's
# order; all of them read the same input.
_SEPARATE = {"qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
             "o_proj": ("self_attn.o_proj",), "gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
             "down_proj": ("mlp.down_proj",)}
_FUSED = {"qkv_proj": ("self_attn.qkv_proj",), "o_proj": ("self_attn.o_proj",),
          "gate_up_proj": ("mlp.gate_up_proj",), "down_proj": ("mlp.down_proj",)}


def layer_parts(hf_model: nn.Module) -> dict[str, tuple[str, ...]]:
    """The engine's linear ("qkv_proj") -> the module paths in each of hf_model's decoder layers that make it up,
    by its architecture. UnsupportedModel when a layer lacks one of them (or it is not a linear layer): statistics
    hooked on the wrong modules would calibrate silently wrong."""
    arch = check_config(hf_model.config)
    parts = _FUSED if arch.fused_checkpoint else _SEPARATE
    for index, layer in enumerate(hf_model.model.layers):
        for path in (p for paths in parts.values() for p in paths):
            try:
                module = layer.get_submodule(path)
            except AttributeError:
                module = None
            if not isinstance(module, nn.Linear):
                raise UnsupportedModel(f"calibration: decoder layer {index} of this {arch.model_type} model has no "
                                       f"linear module {path!r} (expected for {arch.family}); its statistics and "
                                       "sensitivity cannot be measured")
    return parts


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


def fused_weight(hf_model: nn.Module, name: str,
                 parts: dict[str, tuple[str, ...]] | None = None) -> torch.Tensor:
    """The fp32 weight [out, in] of the engine's layer `name` ("layers.3.qkv_proj"), fused as the engine fuses it.
    `parts`: layer_parts(hf_model), when the caller has it already."""
    _, index, proj = name.split(".")
    layer = hf_model.model.layers[int(index)]
    paths = (parts or layer_parts(hf_model))[proj]
    return torch.cat([layer.get_submodule(path).weight.detach().float() for path in paths])


@torch.inference_mode()
def collect_statistics(hf_model: nn.Module, samples: list[list[int]], *, with_gram: bool = True,
                       batch_size: int = 16) -> dict[str, LayerStats]:
    """hf_model: a transformers *ForCausalLM of a supported architecture, in fp32. Runs the decoder stack (not the
    head: no logits are needed) over the samples, `batch_size` at a time, and returns each decoder linear layer's
    LayerStats by engine name."""
    parts = layer_parts(hf_model)
    stats: dict[str, LayerStats] = {}
    handles = []
    for index, layer in enumerate(hf_model.model.layers):
        for proj, paths in parts.items():
            name = f"layers.{index}.{proj}"
            module = layer.get_submodule(paths[0])
            stats[name] = LayerStats(torch.zeros(module.in_features), torch.zeros(module.in_features))

            def hook(module, args, output, name=name) -> None:
                stats[name].add(args[0], with_gram)

            handles.append(module.register_forward_hook(hook))
    try:
        for i in range(0, len(samples), batch_size):
            hf_model.model(input_ids=torch.tensor(samples[i:i + batch_size]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return stats
