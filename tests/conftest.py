"""Shared fixtures: a tiny random LLaMA built in-process (seconds), and the real SmolLM2 for e2e tests."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# No test reads or writes the user's cache (~/.cache/autotune): the session's is a folder of its own, and each test
# gets a cache of its own inside its tmp_path (own_cache). What is keyed by its whole content and costs a minute
# to remake is shared by the session: the converted SmolLM2 (models/, by the GGUF's checksum), the fp32
# references (reference/, by model, text, design and versions) and the capability probe (probe/, by machine and
# versions). A fixture of wider scope that sets AUTOTUNE_CACHE
# itself keeps its own for its tests.
_SESSION_CACHE = Path(tempfile.mkdtemp(prefix="autotune-tests-"))
# Removed when the session ends: each holds a converted model, references and probes (about 2 GB), and the folders
# of 160 earlier runs, left behind, had filled this machine's disk.
atexit.register(shutil.rmtree, _SESSION_CACHE, True)
_SHARED = ("models", "reference", "probe")
for _name in _SHARED:
    (_SESSION_CACHE / _name).mkdir()
os.environ["AUTOTUNE_CACHE"] = str(_SESSION_CACHE)


@pytest.fixture(autouse=True)
def own_cache(request, monkeypatch):
    """AUTOTUNE_CACHE set to this test's own folder (with the session's models and references linked in), unless a
    fixture of wider scope chose one."""
    if os.environ.get("AUTOTUNE_CACHE") != str(_SESSION_CACHE):
        yield Path(os.environ["AUTOTUNE_CACHE"])
        return
    cache = request.getfixturevalue("tmp_path") / "autotune-cache"
    cache.mkdir()
    for name in _SHARED:
        (cache / name).symlink_to(_SESSION_CACHE / name, target_is_directory=True)
    monkeypatch.setenv("AUTOTUNE_CACHE", str(cache))
    yield cache

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-5)


@pytest.fixture(scope="session")
def smollm2_folder():
    from autotune.models.registry import resolve_model
    from autotune.models.weights import weights_folder

    return weights_folder(resolve_model("smollm2-135m"))


# Every weight drawn with std 0.5 instead of 0.02: peaked output distributions that every layer decides. With the
# default init every position is a near tie and the tie-aware gate passes anything (a tiny Qwen3 built as a LLaMA,
# its q/k norms ignored, scored 1.000); with the embedding scaled up instead, the model echoed its input token and
# zeroing any layer changed no greedy choice (the same wrong build: 1.000 raw). Measured on test_accuracy.py's
# windows: 20% near ties; an fp32 build agrees 1.000, bf16 0.86 raw and 0.93 tie-aware (these weights amplify its
# rounding), the Qwen3-as-LLaMA build 0.04.
PEAKED_INIT = 0.5


def make_tiny_llama(vocab_size: int = 512, seed: int = 0, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, **{"tie_word_embeddings": True, "initializer_range": PEAKED_INIT,
                                                    **TINY, **overrides})
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_llama():
    return make_tiny_llama()


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory, smollm2_folder):
    """A tiny random LLaMA saved as a Hugging Face folder, with SmolLM2's tokenizer (so real text tokenizes)."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model = make_tiny_llama(vocab_size=49152)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def decided_model_folder(tmp_path_factory, smollm2_folder):
    """A tiny folder model whose next token is decided by a wide margin: small weights (the default init) and the
    tied embedding scaled 25x, so the head mostly echoes the last token. Only for tests of scheduling (serving)
    that compare bf16 outputs of differently composed batches: a bf16 matmul rounds differently with other rows
    beside it, and the peaked model, whose outputs depend on every layer, then flips tokens (measured: one of 32
    requests diverged at its 6th token). Never for a test of the gate or of numerics."""
    folder = tmp_path_factory.mktemp("decided-llama")
    model = make_tiny_llama(vocab_size=49152, initializer_range=0.02)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(25.0)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, folder / name)
    return folder


# The seed of context_model_folder: of the first five, the one whose smallest top-1 minus top-2 logit margin over
# test_serve.py's 384 greedy positions is widest (0.0041; seeds 0-4 gave 0.0017, 0.0034, 0.0041, 0.0007, 0.0004).
CONTEXT_SEED = 2


@pytest.fixture(scope="session")
def context_model_folder(tmp_path_factory, smollm2_folder):
    """A tiny folder model whose next token depends on the whole context: the peaked LLaMA (every weight drawn with
    std 0.5, so every layer and every earlier token moves the choice; two prompts ending in the same token go on
    differently), with SmolLM2's tokenizer. Served in fp32, where a batch's composition moves a logit by about
    1e-4 (measured, transformers alone against eight left-padded in one batch) and its greedy margins are wider:
    for tests that served outputs equal a reference token for token, and so would see a request read another's KV
    cache."""
    folder = tmp_path_factory.mktemp("context-llama")
    make_tiny_llama(vocab_size=49152, seed=CONTEXT_SEED).save_pretrained(folder)
    # With SmolLM2's chat template (transformers keeps it in a file of its own): /v1/chat/completions renders it.
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (smollm2_folder / name).is_file():
            shutil.copy(smollm2_folder / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matrices: a second thread only waits on the first on a shared 2-core machine (measured 0.6 s against
    3-15 s). transformers and the engine run under the same setting, so their results stay comparable."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
