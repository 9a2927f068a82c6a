"""Shared fixtures: a tiny random LLaMA built in-process (seconds), and the real SmolLM2 for e2e tests."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5)


@pytest.fixture(scope="session")
def smollm2_folder():
    from autotune.models.registry import resolve_model
    from autotune.models.weights import weights_folder

    return weights_folder(resolve_model("smollm2-135m"))


def make_tiny_llama(vocab_size: int = 512, seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, tie_word_embeddings=True, **{**TINY, **overrides})
    model = LlamaForCausalLM(config).eval()
    # Sharper than the default init, so that greedy tokens are decided by margins, not by noise.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(25)
    return model


@pytest.fixture(scope="session")
def tiny_llama():
    return make_tiny_llama()


@pytest.fixture(scope="session")
def sharp_llama():
    """Untied head scaled up: confident predictions that depend on every layer (for gate tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=512, tie_word_embeddings=False, **TINY)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(60)
    return model


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory, smollm2_folder):
    """A tiny random LLaMA saved as a Hugging Face folder, with SmolLM2's tokenizer (so real text tokenizes)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_llama(vocab_size=49152)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, folder / name)
    return folder
