"""Tiny random models of every architecture the engine builds, made in-process from transformers' config classes.

initializer_range 0.5 makes the weights peaked: default-initialised tiny models have near-flat outputs, which any
tie-aware gate passes and on which greedy tokens are decided by noise. Biases are drawn too (transformers zeroes
them, which would leave a dropped bias unseen). Gemma variants untie the head: a tied one (with Gemma's embedding
scale) repeats its last token, a weak test of everything after the embedding."""
from __future__ import annotations

import torch
from torch import nn

BASE = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.5, pad_token_id=0,
            bos_token_id=1, eos_token_id=2)
ALTERNATE = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]
WINDOW = 8  # small enough that prompts of 17..33 tokens reach past it

# One per architecture, each with the features that set it apart (sliding windows at WINDOW where it has them).
ARCHITECTURE_VARIANTS: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", dict(tie_word_embeddings=False)),
    "mistral": ("MistralConfig", dict(sliding_window=WINDOW, head_dim=32)),
    "qwen2": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=2,
                                  tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=32)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                    attn_logit_softcapping=10.0, final_logit_softcapping=30.0,
                                    tie_word_embeddings=False)),
    "gemma3_text": ("Gemma3TextConfig", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW, layer_types=ALTERNATE,
        final_logit_softcapping=30.0, tie_word_embeddings=False, rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}})),
    "phi3": ("Phi3Config", dict(sliding_window=WINDOW)),
}
# Rope scalings and the less common features, on the architecture that carries them.
FEATURE_VARIANTS: dict[str, tuple[str, dict]] = {
    "llama3.1-rope+biases": ("LlamaConfig", dict(attention_bias=True, mlp_bias=True, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "llama-linear-rope": ("LlamaConfig", dict(rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                              "rope_theta": 10000.0})),
    "llama-dynamic-rope": ("LlamaConfig", dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0,
                                                               "rope_theta": 10000.0})),
    "qwen2.5-yarn-rope": ("Qwen2Config", dict(rope_parameters={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 10000.0})),
    "gemma3-tied": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=WINDOW, layer_types=ALTERNATE)),
    "phi3-longrope+partial-rotary": ("Phi3Config", dict(original_max_position_embeddings=256, rope_parameters={
        "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "factor": 4.0,
        "short_factor": [1.0, 1.5, 2.0, 3.0], "long_factor": [2.0, 3.0, 4.0, 6.0],
        "original_max_position_embeddings": 256})),
}
VARIANTS = {**ARCHITECTURE_VARIANTS, **FEATURE_VARIANTS}


def tiny_config(variant: str, **overrides):
    import transformers

    class_name, fields = VARIANTS[variant]
    return getattr(transformers, class_name)(**{**BASE, **fields, **overrides})


def make_tiny(variant: str, seed: int = 0, **overrides):
    """A tiny fp32 *ForCausalLM of `variant`, in eval mode."""
    from transformers import AutoModelForCausalLM

    config = tiny_config(variant, **overrides)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.normal_(0.0, config.initializer_range)
    return model


def make_gate_tiny(variant: str, seed: int = 0, **overrides):
    """make_tiny with attention scores 11x smaller and a head 0.7x: a model whose bf16 build can pass the gate.

    With the peaked weights alone, attention is nearly one-hot and bf16 rounding of two close scores switches the
    key a head reads: transformers' own bf16 model then fails the gate against its fp32 self (tie-aware 0.992 on a
    LLaMA). Tamed so, positions stay decided (top-1 probability ~0.28, a third near ties) and a build that drops
    an architecture's feature still fails by far (test_a_wrong_build_fails_the_gate)."""
    model = make_tiny(variant, seed, **overrides)
    scale = 0.3  # on q and on k: scores x 0.09
    with torch.no_grad():
        for layer in model.model.layers:
            attn = layer.self_attn
            if hasattr(attn, "q_norm"):  # the norms undo a scaled projection: scale them (Gemma's: 1 + weight)
                offset = 1.0 if model.config.model_type.startswith("gemma") else 0.0
                for norm in (attn.q_norm, attn.k_norm):
                    norm.weight.copy_((norm.weight + offset) * scale - offset)
            elif hasattr(attn, "qkv_proj"):
                rows = (model.config.num_attention_heads + model.config.num_key_value_heads) * attn.head_dim
                attn.qkv_proj.weight[:rows].mul_(scale)
            else:
                for proj in (attn.q_proj, attn.k_proj):
                    proj.weight.mul_(scale)
                    if proj.bias is not None:
                        proj.bias.mul_(scale)
        head = model.model.embed_tokens if model.config.tie_word_embeddings else model.lm_head
        head.weight.mul_(0.7)
    return model


def hf_greedy(model, prompts: list[list[int]], new: int) -> list[list[int]]:
    """transformers' own greedy continuation of each prompt (one at a time: no padding to differ)."""
    out = []
    for p in prompts:
        ids = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                             max_new_tokens=new, min_new_tokens=new, do_sample=False)
        out.append(ids[0, len(p):].tolist())
    return out
