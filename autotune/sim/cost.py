"""What one forward step of a decoder-only model asks of the hardware: FLOPs, bytes and kernels, per layer
and in total. Pure arithmetic on architecture facts (GQA's KV heads, Gemma's head_dim, tied embeddings, sliding
windows); no hardware figures here."""
from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.config.deploy import DTYPE_BYTES
from autotune.models.registry import ModelSpec

__all__ = [
    "ACT_BYTES",
    "WEIGHT_BYTES",
    "linear_weight_bytes",
    "StepCost",
    "kernels_per_layer",
    "layer_activation_elems",
    "linear_params_per_layer",
    "step_cost",
    "streamed_weight_bytes",
    "weight_bytes",
]

# Bytes per linear-layer weight of the quantized schemes. int4 carries a 16-bit scale and zero point per group of
# 128 weights; int8 a per-channel scale (negligible). Quant "none" stores the dtype's bytes, and the embedding,
# lm_head and norms stay in the dtype whatever the scheme, as in this project's engine.
WEIGHT_BYTES = {"w8a16": 1.0, "w8a8": 1.0, "w4a16": 0.5 + 4 / 128}
ACT_BYTES = 2.0  # bytes of a 16-bit activation or KV element (bf16, fp16); fp32 doubles it (DTYPE_BYTES)


def linear_weight_bytes(quant: str, dtype: str = "bf16") -> float:
    return float(DTYPE_BYTES[dtype]) if quant == "none" else WEIGHT_BYTES[quant]

# The operators of one decoder layer as an engine launches them: (kernels, elements written per token as
# (hidden, kv_dim, intermediate) multiples, fused away at O2). O2 chains norm+matmul, rope into qkv, the
# residual adds and SiLU*up into the matmuls around them, so their outputs never go back to memory.
_LAYER_OPS = (
    ("rmsnorm", 2, (2, 0, 0), True),
    ("qkv_proj", 3, (1, 2, 0), False),
    ("rope", 2, (1, 1, 0), True),
    ("kv_write", 1, (0, 0, 0), False),
    ("attention", 3, (1, 0, 0), False),
    ("o_proj", 1, (1, 0, 0), False),
    ("residual_add", 2, (2, 0, 0), True),
    ("gate_up_proj", 2, (0, 0, 2), False),
    ("silu_mul", 2, (0, 0, 2), True),
    ("down_proj", 1, (1, 0, 0), False),
)
# w8a8 quantizes the activations in front of the four matmul groups: one more kernel and one int8 copy each.
_W8A8_QUANT_KERNELS = 4
HEAD_KERNELS = 4  # embedding lookup, final norm, lm_head, sampling


def linear_params_per_layer(spec: ModelSpec) -> int:
    # q and o are heads x head_dim wide: the hidden size in LLaMA, not in Gemma (head_dim 256 at any width)
    q_dim, kv_dim = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    return spec.hidden_size * (q_dim * 2 + 2 * kv_dim) + 3 * spec.hidden_size * spec.intermediate_size


def weight_bytes(spec: ModelSpec, quant: str, dtype: str = "bf16") -> float:
    """Bytes of the deployed weights: quantized decoder linears, norms, embedding and lm_head in the dtype."""
    width = DTYPE_BYTES[dtype]
    linear = spec.num_layers * linear_params_per_layer(spec) * linear_weight_bytes(quant, dtype)
    norms = (2 * spec.num_layers + 1) * spec.hidden_size * width
    embed = spec.vocab_size * spec.hidden_size * width * (1 if spec.tied_embeddings else 2)
    return linear + norms + embed


def streamed_weight_bytes(spec: ModelSpec, quant: str, dtype: str = "bf16") -> float:
    """Bytes read from memory by one step: every decoder weight and lm_head; only looked-up embedding rows."""
    width = DTYPE_BYTES[dtype]
    linear = spec.num_layers * linear_params_per_layer(spec) * linear_weight_bytes(quant, dtype)
    return linear + (2 * spec.num_layers + 1) * spec.hidden_size * width + spec.vocab_size * spec.hidden_size * width


def kernels_per_layer(quant: str, fused: bool) -> int:
    total = sum(n for _, n, _, f in _LAYER_OPS if not (fused and f))
    return total + (_W8A8_QUANT_KERNELS if quant == "w8a8" else 0)


def layer_activation_elems(spec: ModelSpec, fused: bool) -> int:
    """Elements one token writes between kernels in one layer (each is written once and read back once)."""
    kv_dim = spec.num_kv_heads * spec.head_dim
    h, i = spec.hidden_size, spec.intermediate_size
    return sum(a * h + b * kv_dim + c * i for _, _, (a, b, c), f in _LAYER_OPS if not (fused and f))


@dataclass(frozen=True, slots=True)
class StepCost:
    """One forward step of `rows` sequences, each adding `new_tokens` tokens after `context` earlier ones."""

    matmul_flops: float
    attention_flops: float
    weight_bytes: float
    activation_bytes: float
    kv_bytes: float
    kernels_per_layer: int


def step_cost(spec: ModelSpec, quant: str, fused: bool, rows: int, new_tokens: int, context: float,
              page_size: int, dtype: str = "bf16") -> StepCost:
    """Prefill: new_tokens = prompt length, context = 0. Decode: new_tokens = 1, context = tokens so far.
    Activations and the KV cache are in `dtype`."""
    tokens = rows * new_tokens
    layers, h = spec.num_layers, spec.hidden_size
    width = float(DTYPE_BYTES[dtype])
    kv_per_token = spec.kv_bytes_per_token(width)
    # Logits only for the last position of each sequence, as the engine samples from it alone.
    matmul = 2 * tokens * layers * linear_params_per_layer(spec) + 2 * rows * h * spec.vocab_size
    # q.k and p.v over every earlier position: sum of (context + j) for j in 1..new_tokens
    attended = new_tokens * context + new_tokens * (new_tokens + 1) / 2
    attention = 4 * rows * layers * spec.num_heads * spec.head_dim * attended
    act = 2 * tokens * layers * layer_activation_elems(spec, fused) * width
    if quant == "w8a8":  # the int8 copy of each matmul input
        act += tokens * layers * (3 * h + spec.intermediate_size) * 1.0
    # Paged attention reads whole pages of earlier tokens (the tail of the last page too); new K/V is written.
    pages_read = math.ceil(context / page_size) * page_size if context else 0
    kv = rows * (pages_read + new_tokens) * kv_per_token
    if spec.num_sliding_layers:
        # Windowed layers attend to (and read) their last `sliding_window` positions only.
        window = spec.sliding_window
        full, windowed = spec.num_full_layers, spec.num_sliding_layers
        # sum over j in 1..new_tokens of min(context + j, window)
        within = min(max(window - context, 0.0), new_tokens)
        attended_windowed = within * context + within * (within + 1) / 2 + (new_tokens - within) * window
        attention = 4 * rows * spec.num_heads * spec.head_dim * (full * attended + windowed * attended_windowed)
        window_read = min(pages_read, (math.ceil(window / page_size) + 1) * page_size)
        kv = rows * (full * pages_read + windowed * window_read + layers * new_tokens) \
            * spec.kv_bytes_per_token_layer(width)
    return StepCost(matmul, attention, streamed_weight_bytes(spec, quant, dtype), act, kv,
                    kernels_per_layer(quant, fused))
