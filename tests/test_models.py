"""--model: a registry name (registry.yaml), a local folder or a Hub id (the local Hub cache offline); a model the
engine cannot build is refused at once, in one line, before any storage is opened."""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from model_factory import make_tiny

from autotune.errors import UserInputError
from autotune.models.architectures import ARCHITECTURES, UnsupportedModel
from autotune.models.registry import REGISTRY, REGISTRY_PATH, resolve_model
from autotune.models.weights import load_hf_model, model_checksum, weights_folder

TINY_LLAMA_CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
                     "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 256}


def _folder(tmp_path: Path, config: dict, name: str = "model") -> Path:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def _one_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("autotune:")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    return lines[0]


def test_the_registry_is_data():
    assert REGISTRY_PATH.suffix == ".yaml" and REGISTRY_PATH.is_file()
    assert {"smollm2-135m", "llama-7b", "llama-13b", "llama-3-8b", "qwen2-7b"} <= set(REGISTRY)
    assert {spec.architecture for spec in REGISTRY.values()} == set(ARCHITECTURES)
    llama = REGISTRY["llama-7b"]
    assert llama.hub_id == "meta-llama/Llama-2-7b-hf" and llama.source == "hf-hub:meta-llama/Llama-2-7b-hf"
    assert REGISTRY["smollm2-135m"].source.startswith("gguf-package:")
    gemma = REGISTRY["gemma-2-9b"]
    assert (gemma.head_dim, gemma.sliding_window, gemma.num_sliding_layers) == (256, 4096, 21)
    assert gemma.num_params == pytest.approx(9.24e9, rel=0.01)  # published: 9.24 B


def test_a_local_folder_is_read_through_its_config_class(tmp_path):
    config = {**TINY_LLAMA_CONFIG, "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
              "rope_theta": 500000.0}
    spec = resolve_model(str(_folder(tmp_path, config)))
    assert (spec.name, spec.architecture, spec.num_layers, spec.num_kv_heads) == ("model", "llama", 2, 2)
    assert spec.source == f"hf-folder:{(tmp_path / 'model').resolve()}"


@pytest.mark.parametrize("config, words", [
    ({**TINY_LLAMA_CONFIG, "model_type": "mamba", "architectures": ["MambaForCausalLM"]},
     ["unsupported architecture 'mamba'", "MambaForCausalLM"]),
    ({**TINY_LLAMA_CONFIG, "model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"]},
     ["'gemma3'", "gemma3_text"]),
    ({**TINY_LLAMA_CONFIG, "rope_scaling": {"rope_type": "proportional", "partial_rotary_factor": 0.5}},
     ["llama", "rope_type 'proportional'"]),
])
def test_what_the_engine_cannot_build_is_refused_naming_the_supported(tmp_path, config, words):
    with pytest.raises(UnsupportedModel) as err:
        resolve_model(str(_folder(tmp_path, config)))
    message = str(err.value)
    assert all(w in message for w in words) and "\n" not in message
    assert all(arch in message for arch in ARCHITECTURES)


def test_a_config_lacking_a_field_names_it(tmp_path):
    config = {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "num_attention_heads"}
    with pytest.raises(UnsupportedModel, match="lacks the field 'num_attention_heads'"):
        resolve_model(str(_folder(tmp_path, config)))


@pytest.mark.slow
def test_search_refuses_an_unsupported_model_before_opening_storage(tmp_path):
    # The bug this guards: a non-LLaMA folder read as a LLaMA ran the reference and the baseline, then every trial
    # failed minutes later. Now: exit 2, one line, no study storage written.
    folder = _folder(tmp_path, {**TINY_LLAMA_CONFIG, "model_type": "mamba", "architectures": ["MambaForCausalLM"]})
    line = _one_line(_cli("search", "--model", str(folder), "--trials", "1", cwd=tmp_path))
    assert "unsupported architecture 'mamba'" in line and "supported: llama" in line and "gemma2" in line
    missing = _folder(tmp_path, {k: v for k, v in TINY_LLAMA_CONFIG.items() if k != "hidden_size"}, "missing")
    line = _one_line(_cli("search", "--model", str(missing), "--trials", "1", cwd=tmp_path))
    assert "lacks the field 'hidden_size'" in line
    assert not list(tmp_path.rglob("*.db"))


@pytest.mark.slow
def test_models_lists_the_registry_and_the_supported_architectures(tmp_path):
    proc = _cli("models", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in (*REGISTRY, *ARCHITECTURES, "Gemma 2", "Phi-3", "llama3", "yarn"):
        assert name in proc.stdout


def _fake_hub_cache(root: Path, hub_id: str, model) -> Path:
    """A Hugging Face Hub cache as huggingface_hub lays it out: refs/main names the snapshot, whose files link to
    blobs named by their sha256."""
    repo = root / f"models--{hub_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / ("0" * 40)
    model.save_pretrained(snapshot)
    (repo / "blobs").mkdir(parents=True)
    for path in snapshot.iterdir():
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        path.rename(repo / "blobs" / digest)
        path.symlink_to(Path("..", "..", "blobs", digest))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    return snapshot


def test_a_hub_id_resolves_from_the_local_hub_cache_offline(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = _fake_hub_cache(cache, "tiny-org/tiny-qwen3", make_tiny("qwen3"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    spec = resolve_model("tiny-org/tiny-qwen3")
    assert (spec.name, spec.architecture, spec.head_dim, spec.source) == ("tiny-qwen3", "qwen3", 32,
                                                                          "hf-hub:tiny-org/tiny-qwen3")
    assert weights_folder(spec) == snapshot
    # The checksum comes from the blob names (sha256 of each file's content), as if the weights had been read.
    weights = sorted(snapshot.glob("*.safetensors"))
    expected = hashlib.sha256(b"".join(hashlib.sha256(w.read_bytes()).digest() for w in weights)).hexdigest()
    assert model_checksum(spec) == f"sha256:{expected}"
    assert torch.equal(load_hf_model(spec).lm_head.weight, make_tiny("qwen3").lm_head.weight)


def test_a_hub_id_absent_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserInputError, match="nor in the local Hugging Face cache.*HF_HUB_OFFLINE=0"):
        resolve_model("nobody/absent-model")
    # A registry model's Hub id still has its facts (enough for the simulator); its weights are not here.
    spec = resolve_model("meta-llama/Llama-2-7b-hf")
    assert spec.name == "llama-7b" and spec.has_weights
    with pytest.raises(UserInputError, match="llama-7b.*not in the local Hugging Face cache"):
        weights_folder(REGISTRY["llama-7b"])


def test_a_registry_name_finds_its_weights_in_the_hub_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    snapshot = _fake_hub_cache(cache, "meta-llama/Llama-2-7b-hf", make_tiny("llama"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert weights_folder(resolve_model("llama-7b")) == snapshot

