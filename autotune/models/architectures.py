"""The architectures the engine builds, what each does beyond LLaMA, and the checks that refuse any other model
(or a config using a feature the engine lacks) before a study opens its storage.

Facts are read from transformers' config object (e.g. `rope_parameters`, not the JSON key `rope_theta`); the raw
config.json is only looked at to name a field it lacks, since a config class fills a missing field with a default
that belongs to another model."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autotune.errors import UserInputError

__all__ = [
    "ACTIVATIONS",
    "ARCHITECTURES",
    "ROPE_TYPES",
    "Architecture",
    "UnsupportedModel",
    "check_config",
    "check_config_dict",
    "context_length",
    "rope_parameters_by_layer_type",
    "supported_line",
    "windowed_layers",
]


class UnsupportedModel(UserInputError):
    """A model the engine cannot build (architecture, or a feature of its config), or a config lacking a field."""


@dataclass(frozen=True, slots=True)
class Architecture:
    """One family the engine builds (keyed by transformers' `model_type`); the defaults are LLaMA's numerics.

    windows: which layers use sliding-window attention when the config sets `sliding_window`: "none" (LLaMA
    ignores the field), "all" (Mistral, Phi-3) or "layer_types" (Qwen2/3, Gemma: the config's per-layer list)."""

    model_type: str
    family: str  # in people's words, for messages and `autotune models`
    config_class: str
    windows: str = "none"
    norm_offset: bool = False  # RMSNorm scales by (1 + weight) in fp32 before the cast (Gemma)
    embed_scale: bool = False  # embeddings multiplied by sqrt(hidden) in the weights' dtype (Gemma)
    sandwich_norms: bool = False  # norms on the attention and MLP outputs too (Gemma)
    qk_norm: bool = False  # RMSNorm over each head's q and k before rope (Qwen3, Gemma 3)
    fused_checkpoint: bool = False  # the checkpoint holds qkv_proj and gate_up_proj already fused (Phi-3)
    query_pre_attn_scalar: bool = False  # attention scale query_pre_attn_scalar ** -0.5 (Gemma)
    attn_softcap: bool = False  # tanh soft-capping of attention scores (Gemma 2; Gemma 3's modeling ignores it)
    final_softcap: bool = False  # tanh soft-capping of the logits (Gemma)
    rope_per_layer_type: bool = False  # rope parameters per layer type, local and global (Gemma 3)
    partial_rotary: bool = False  # rope on the first partial_rotary_factor of each head (Phi-3 family)
    activation_field: str = "hidden_act"
    has_bidirectional: bool = False  # the config has use_bidirectional_attention (refused when set)


ARCHITECTURES: dict[str, Architecture] = {a.model_type: a for a in (
    Architecture("llama", "LLaMA 2/3/3.1+, SmolLM2", "LlamaConfig"),
    Architecture("mistral", "Mistral", "MistralConfig", windows="all"),
    Architecture("qwen2", "Qwen2/2.5", "Qwen2Config", windows="layer_types"),
    Architecture("qwen3", "Qwen3", "Qwen3Config", windows="layer_types", qk_norm=True),
    Architecture("gemma2", "Gemma 2", "Gemma2Config", windows="layer_types", norm_offset=True, embed_scale=True,
                 sandwich_norms=True, query_pre_attn_scalar=True, attn_softcap=True, final_softcap=True,
                 activation_field="hidden_activation", has_bidirectional=True),
    Architecture("gemma3_text", "Gemma 3 (text-only checkpoints)", "Gemma3TextConfig", windows="layer_types",
                 norm_offset=True, embed_scale=True, sandwich_norms=True, qk_norm=True, query_pre_attn_scalar=True,
                 final_softcap=True, rope_per_layer_type=True, activation_field="hidden_activation",
                 has_bidirectional=True),
    Architecture("phi3", "Phi-3", "Phi3Config", windows="all", fused_checkpoint=True, partial_rotary=True),
)}

# Rope scaling the engine implements. dynamic: transformers rescales only past max_position_embeddings, which is
# also where the engine's tables end, so below it the tables are the default ones. longrope: the short factors,
# which transformers uses up to original_max_position_embeddings; the engine's context stops there.
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# transformers' ACT2FN names -> the engine's function
ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh"}

# Known model types refused for a reason worth saying.
_REFUSED = {
    "gemma3": "the multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration); its text-only checkpoints "
              "(model_type gemma3_text, e.g. gemma-3-1b) are supported",
    "gemma": "Gemma 1",
    "mixtral": "mixture of experts",
    "qwen2_moe": "mixture of experts",
    "qwen3_moe": "mixture of experts",
    "phi": "Phi-1/2 (LayerNorm, parallel attention)",
    "phi3small": "Phi-3-small (block-sparse attention)",
}
# Fields a config.json must state: a config class would otherwise fill them with another model's sizes.
REQUIRED_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def supported_line() -> str:
    return "supported: " + ", ".join(f"{a.model_type} ({a.family})" for a in ARCHITECTURES.values())


def _refuse(where: str, what: str) -> UnsupportedModel:
    return UnsupportedModel(f"{where}: {what}; {supported_line()}")


def check_config_dict(raw: dict[str, Any], where: str) -> Architecture:
    """The raw config.json of a folder: its model_type must be supported and the sizes stated."""
    model_type = raw.get("model_type")
    if not model_type:
        raise _refuse(where, "config.json lacks the field 'model_type'")
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        classes = ", ".join(raw.get("architectures") or []) or "no architectures listed"
        reason = f", {_REFUSED[model_type]}" if model_type in _REFUSED else ""
        raise _refuse(where, f"unsupported architecture {model_type!r} ({classes}{reason})")
    for name in REQUIRED_FIELDS:
        if name not in raw:
            raise UnsupportedModel(f"{where}: the {model_type} config.json lacks the field {name!r}")
    return arch


def _field(config, name: str, arch: Architecture, where: str):
    if not hasattr(config, name):
        raise UnsupportedModel(f"{where}: the {arch.model_type} config lacks the field {name!r}")
    return getattr(config, name)


def rope_parameters_by_layer_type(config, arch: Architecture) -> dict[str | None, dict]:
    """{layer type: rope parameters}; one entry keyed None where every layer shares them."""
    rope = _field(config, "rope_parameters", arch, arch.model_type)
    if arch.rope_per_layer_type:
        return {kind: rope[kind] for kind in sorted(set(config.layer_types))}
    return {None: rope}


def windowed_layers(config, arch: Architecture) -> list[bool]:
    """Per layer, whether it attends within `config.sliding_window` positions only (as transformers' modeling)."""
    window = getattr(config, "sliding_window", None)
    if arch.windows == "none" or not window:
        return [False] * config.num_hidden_layers
    if arch.windows == "all":
        return [True] * config.num_hidden_layers
    return [kind == "sliding_attention" for kind in config.layer_types]


def context_length(config, arch: Architecture) -> int:
    """Positions the engine's rope tables cover (longrope: up to where transformers switches to its long factors)."""
    length = int(config.max_position_embeddings)
    for rope in rope_parameters_by_layer_type(config, arch).values():
        if rope.get("rope_type", "default") == "longrope":
            original = rope.get("original_max_position_embeddings") or getattr(
                config, "original_max_position_embeddings", length)
            length = min(length, int(original or length))
    return length


def check_config(config, where: str = "") -> Architecture:
    """A transformers config object the engine can build, or UnsupportedModel naming what it cannot."""
    model_type = getattr(config, "model_type", "")
    where = where or f"model {model_type or type(config).__name__}"
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        reason = f", {_REFUSED[model_type]}" if model_type in _REFUSED else ""
        raise _refuse(where, f"unsupported architecture {model_type!r} ({type(config).__name__}{reason})")
    name = arch.model_type
    for field in (*REQUIRED_FIELDS, "num_key_value_heads", "rms_norm_eps", "max_position_embeddings"):
        if _field(config, field, arch, where) is None:
            raise UnsupportedModel(f"{where}: the {name} config lacks the field {field!r}")
    if getattr(config, "quantization_config", None):
        method = dict(config.quantization_config).get("quant_method", "?") if isinstance(
            config.quantization_config, dict) else type(config.quantization_config).__name__
        raise _refuse(where, f"a pre-quantized {name} checkpoint ({method}) is not supported: use its unquantized "
                             "weights (the search quantizes)")
    if config.num_attention_heads % config.num_key_value_heads:
        raise _refuse(where, f"{name}: num_attention_heads {config.num_attention_heads} is not a multiple of "
                             f"num_key_value_heads {config.num_key_value_heads}")
    activation = _field(config, arch.activation_field, arch, where)
    if activation not in ACTIVATIONS:
        raise _refuse(where, f"{name}: {arch.activation_field} {activation!r} is not supported "
                             f"(supported: {', '.join(ACTIVATIONS)})")
    if arch.has_bidirectional and getattr(config, "use_bidirectional_attention", False):
        raise _refuse(where, f"{name}: use_bidirectional_attention (an encoder) is not supported")
    if arch.windows == "layer_types" and getattr(config, "sliding_window", None):
        kinds = set(_field(config, "layer_types", arch, where))
        if not kinds <= {"full_attention", "sliding_attention"}:
            raise _refuse(where, f"{name}: layer types {sorted(kinds)} are not supported "
                                 "(supported: full_attention, sliding_attention)")
    for kind, rope in rope_parameters_by_layer_type(config, arch).items():
        if not isinstance(rope, dict) or "rope_theta" not in rope:
            raise UnsupportedModel(f"{where}: the {name} config lacks the field 'rope_parameters.rope_theta'"
                                   + (f" for {kind}" if kind else ""))
        rope_type = rope.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise _refuse(where, f"{name}: rope_type {rope_type!r} is not supported (supported: "
                                 f"{', '.join(ROPE_TYPES)})")
        if rope.get("partial_rotary_factor", 1.0) not in (None, 1.0) and not arch.partial_rotary:
            raise _refuse(where, f"{name}: partial_rotary_factor {rope['partial_rotary_factor']} is not supported")
    return arch
