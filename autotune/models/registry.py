"""The model registry: a name gives the architecture facts and, where this machine can have them, the weights.

`--model` is a registry name (registry.yaml, next to this file), a local Hugging Face folder, or a Hub id: the
latter two are read from their config through transformers' config classes and refused at once when the engine
cannot build them (autotune/models/architectures.py)."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path

import yaml

from autotune.errors import ModelNotFound
from autotune.models.architectures import (
    ARCHITECTURES,
    UnsupportedModel,
    check_config,
    check_config_dict,
    context_length,
    windowed_layers,
)

__all__ = [
    "REGISTRY",
    "REGISTRY_PATH",
    "ModelSpec",
    "hub_cache_dir",
    "hub_offline",
    "resolve_model",
    "spec_from_config",
]

REGISTRY_PATH = Path(__file__).resolve().with_name("registry.yaml")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Architecture facts of a decoder-only model, and where its weights come from.

    head_dim: 0 means hidden_size / num_heads (Gemma's differs). sliding_window: the window of the
    num_sliding_layers layers that attend only that far back (0: none)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    source: str  # "gguf-package:<module>/<file>", "hf-folder:<path>", "hf-hub:<id>" or "architecture-only"
    hub_id: str = ""
    max_position: int = 4096
    architecture: str = "llama"
    head_dim: int = 0
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # The published checkpoint's dtype (its config.json), what transformers' dtype="auto" loads; "" where the
    # weights folder's own config says it (a folder converted from GGUF says float32: the conversion's dtype).
    dtype: str = ""

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{self.name}: unknown architecture {self.architecture!r}")
        if not 0 <= self.num_sliding_layers <= self.num_layers or bool(self.sliding_window) != bool(
                self.num_sliding_layers):
            raise ValueError(f"{self.name}: sliding_window and num_sliding_layers go together, within num_layers")

    @property
    def num_full_layers(self) -> int:
        """Layers attending to the whole context (all of them without sliding windows)."""
        return self.num_layers - self.num_sliding_layers

    @property
    def num_params(self) -> int:
        attn = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)
        mlp = 3 * self.hidden_size * self.intermediate_size
        embed = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.num_layers * (attn + mlp + 2 * self.hidden_size) + embed + self.hidden_size

    def kv_bytes_per_token(self, bytes_per_value: float) -> float:
        # K and V for every layer: 2 x layers x kv_heads x head_dim values
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value

    def kv_bytes_per_token_layer(self, bytes_per_value: float) -> float:
        return 2 * self.num_kv_heads * self.head_dim * bytes_per_value

    @property
    def has_weights(self) -> bool:
        return self.source != "architecture-only"


def _load_registry(path: Path) -> dict[str, ModelSpec]:
    known = {f.name for f in fields(ModelSpec)} - {"name"}
    out = {}
    for name, entry in (yaml.safe_load(path.read_text()) or {}).items():
        unknown = set(entry) - known
        assert not unknown, f"{path}: {name}: unknown fields {sorted(unknown)}"
        source = entry.pop("source", None) or (f"hf-hub:{entry['hub_id']}" if entry.get("hub_id")
                                               else "architecture-only")
        out[name] = ModelSpec(name=name, source=source, **entry)
    return out


REGISTRY: dict[str, ModelSpec] = _load_registry(REGISTRY_PATH)


def spec_from_config(config, name: str, source: str, hub_id: str = "", where: str = "") -> ModelSpec:
    """The facts of a transformers config object the engine can build (else UnsupportedModel)."""
    arch = check_config(config, where or name)
    windowed = windowed_layers(config, arch)
    return ModelSpec(
        name=name, num_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
        num_heads=config.num_attention_heads, num_kv_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size, vocab_size=config.vocab_size,
        tied_embeddings=bool(config.tie_word_embeddings), source=source, hub_id=hub_id,
        max_position=context_length(config, arch), architecture=arch.model_type,
        head_dim=getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
        sliding_window=int(config.sliding_window) if any(windowed) else 0, num_sliding_layers=sum(windowed),
    )


def _from_hf_folder(folder: Path, name: str, source: str, hub_id: str = "") -> ModelSpec:
    where = str(folder)
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"{folder}/config.json is not a usable Hugging Face config: {exc}") from exc
    if not isinstance(raw, dict):
        raise ModelNotFound(f"{folder}/config.json is not a usable Hugging Face config (not a mapping)")
    check_config_dict(raw, where)
    from huggingface_hub.errors import StrictDataclassError
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsupportedModel(f"{where}: transformers refuses its {raw['model_type']} config: {first}") from None
    return spec_from_config(config, name, source, hub_id, where)


def hub_offline() -> bool:
    """As huggingface_hub reads HF_HUB_OFFLINE, but now (the CLI sets it after the library may have loaded)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in {"1", "ON", "YES", "TRUE"}


def hub_cache_dir() -> str | None:
    """HF_HUB_CACHE as set now; None: the library's default (HF_HOME/hub)."""
    return os.environ.get("HF_HUB_CACHE") or None


def _from_hub(hub_id: str) -> ModelSpec:
    """The Hub model's config: from the local Hub cache when offline (HF_HUB_OFFLINE=1), else downloaded."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    config_path = try_to_load_from_cache(hub_id, "config.json", cache_dir=hub_cache_dir())
    if not isinstance(config_path, str):
        registered = [spec for spec in REGISTRY.values() if spec.hub_id == hub_id]
        if hub_offline():
            if registered:  # facts known without the weights: enough for the simulator
                return registered[0]
            raise ModelNotFound(f"{hub_id} is neither a local folder nor in the local Hugging Face cache, and "
                                "HF_HUB_OFFLINE=1: set HF_HUB_OFFLINE=0 to download it, or pass a local folder")
        try:
            config_path = hf_hub_download(hub_id, "config.json", cache_dir=hub_cache_dir())
        except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ModelNotFound(f"cannot fetch {hub_id} from the Hugging Face Hub: {first}") from None
    return _from_hf_folder(Path(config_path).parent, hub_id.rsplit("/", 1)[-1], f"hf-hub:{hub_id}", hub_id)


def resolve_model(name_or_path: str) -> ModelSpec:
    """A registry name, a local Hugging Face folder (one holding config.json), or a Hub id ("org/name")."""
    if name_or_path in REGISTRY:
        return REGISTRY[name_or_path]
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ModelNotFound(f"{folder} has no config.json: not a Hugging Face model folder")
        return _from_hf_folder(folder, folder.name, f"hf-folder:{folder.resolve()}")
    if _HUB_ID.fullmatch(name_or_path):
        return _from_hub(name_or_path)
    known = ", ".join(sorted(REGISTRY))
    raise ModelNotFound(
        f"unknown model {name_or_path!r}: use one of {known}, a local Hugging Face folder with a config.json, "
        "or a Hugging Face Hub id (org/name)"
    )
