"""The model as GGUF files, one per type: the model's own file as its source, the other types made from it once with
llama.cpp's quantizer (llama_model_quantize, the library function behind llama-quantize) and cached by the source's
checksum and the llama.cpp version that made them."""
from __future__ import annotations

import os
from pathlib import Path

from autotune.errors import ModelNotFound, TrialFailure
from autotune.models.registry import ModelSpec
from autotune.models.weights import locate_package_file  # the one place that finds a package's file
from autotune.paths import cache_root
from autotune.progress import log

__all__ = ["source_gguf", "gguf_file", "FTYPES"]

# GGUF type -> llama.cpp's LLAMA_FTYPE_MOSTLY_* name (llama_cpp.py's constants).
FTYPES = {"Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
          "F16": "LLAMA_FTYPE_MOSTLY_F16", "BF16": "LLAMA_FTYPE_MOSTLY_BF16"}


def source_gguf(spec: ModelSpec) -> Path:
    """The GGUF a model ships as: the file inside its package (SmolLM2's Q4_1), or, for a folder model, the one
    GGUF file kept in the folder beside its safetensors (llama.cpp's convert_hf_to_gguf.py writes it)."""
    if spec.source.startswith("gguf-package:"):
        return locate_package_file(spec.source)
    if spec.source.startswith("hf-folder:"):
        folder = Path(spec.source.removeprefix("hf-folder:"))
        found = sorted(folder.glob("*.gguf"))
        if len(found) == 1:
            return found[0]
        what = "no GGUF file" if not found else f"{len(found)} GGUF files"
        raise ModelNotFound(f"{folder} holds {what}: the llamacpp backend needs exactly one; write it with llama.cpp's "
                            f"convert_hf_to_gguf.py {folder} --outtype f32 --outfile {folder}/model-f32.gguf")
    raise ModelNotFound(f"{spec.name} ({spec.source}) has no GGUF file the llamacpp backend can read")


def _quantize(source: Path, out: Path, gguf_type: str, threads: int) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, FTYPES[gguf_type])
    params.nthread = threads
    # The shipped file is itself quantized (Q4_1, its embedding Q8_0): every type is then re-quantized from those
    # values, never from the original bf16 weights, which no file here holds. F16/BF16 hold them exactly.
    params.allow_requantize = True
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    code = llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params)
    if code != 0:
        tmp.unlink(missing_ok=True)
        raise TrialFailure(f"llama.cpp could not quantize {source.name} to {gguf_type} (code {code})")
    tmp.replace(out)  # atomic: a concurrent trial never reads half a file


def gguf_file(spec: ModelSpec, checksum: str, gguf_type: str, threads: int = 0) -> Path:
    """The model's GGUF of `gguf_type` ("source": its own file), made on first use."""
    source = source_gguf(spec)
    if gguf_type == "source":
        return source
    import llama_cpp

    out = cache_root() / "llamacpp" / "gguf" / f"{checksum.removeprefix('sha256:')[:16]}-{llama_cpp.__version__}" \
        / f"{gguf_type}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        log(f"  llama.cpp: quantizing {source.name} to {gguf_type} (once)")
        _quantize(source, out, gguf_type, threads or os.cpu_count() or 1)
    return out
