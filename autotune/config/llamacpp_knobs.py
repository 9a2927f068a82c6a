"""llama.cpp's knobs (a GGUF file run by llama-cpp-python in trials and llama-server in serving): the file's type,
the batch sizes, the attention kernel and the KV cache. Frozen and validated in llama.cpp's terms; the shared knobs
(parallel sequences = batch, threads = device power) are DeployConfig's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autotune.config.choices import check_choices

__all__ = ["LlamaCppKnobs", "GGUF_TYPES", "KV_TYPES", "FLASH_ATTN"]

# "source": the model's own GGUF as shipped (SmolLM2's is Q4_1); the others are made from it once per model with
# llama.cpp's quantizer (autotune/llamacpp/gguf_files.py) and cached.
GGUF_TYPES = ("source", "Q4_0", "Q4_K_M", "Q8_0", "F16", "BF16")
# The KV cache's storage type (K and V alike). A quantized V cache needs flash attention: llama.cpp refuses it
# otherwise.
KV_TYPES = ("f16", "q8_0")
# "auto": llama.cpp turns flash attention on where the device has the kernel (every CPU build has it).
FLASH_ATTN = ("auto", "on", "off")


@dataclass(frozen=True, slots=True)
class LlamaCppKnobs:
    """`n_batch`: the most tokens one decode call takes (prompt chunks and decode steps together); `n_ubatch`: what
    one compute graph runs at a time; `n_ctx`: the whole KV cache in tokens (0: the context the model was trained
    with), shared by the parallel sequences (a unified cache, as llama-server runs with its default --parallel).
    The defaults are llama-server's given only a model, but for a context that holds a study's batch."""

    RUNTIME: ClassVar[str] = "llamacpp"
    NUMERICS: ClassVar[tuple[str, ...]] = ("gguf_type", "kv_type", "flash_attn")
    # Every knob came after the first recipes were named by digest: each is left out of keys at its default.
    LATER: ClassVar[tuple[str, ...]] = ("gguf_type", "n_batch", "n_ubatch", "flash_attn", "kv_type", "n_ctx")
    CHOICES: ClassVar[dict[str, tuple]] = {"gguf_type": GGUF_TYPES, "kv_type": KV_TYPES, "flash_attn": FLASH_ATTN}
    # The simulator sees the file's type alone (cost_knobs: F16 and BF16; the quantized types have no cost view).
    MODELED: ClassVar[tuple[str, ...]] = ("gguf_type",)
    SCHEME: ClassVar[tuple[str, ...]] = MODELED

    gguf_type: str = "source"
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: str = "auto"
    kv_type: str = "f16"
    n_ctx: int = 4096

    def __post_init__(self) -> None:
        check_choices(self)
        if self.kv_type != "f16" and self.flash_attn == "off":
            raise ValueError(f"a {self.kv_type} KV cache needs flash attention (llama.cpp quantizes V only in it)")
        if self.n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0 (0: the model's trained context), not {self.n_ctx}")
        if not 1 <= self.n_ubatch <= self.n_batch:
            raise ValueError(f"need 1 <= n_ubatch <= n_batch, not {self.n_ubatch}, {self.n_batch}")

    def keyed(self, values: dict) -> dict:
        """`values` with the knobs at their defaults left out (see LATER)."""
        return {k: v for k, v in values.items() if k not in self.LATER or _DEFAULTS[k] != v}

    def cost_knobs(self) -> dict | None:
        """The simulator's view of an F16 or BF16 file (sim/cost.py); None for the quantized types, whose dot
        products (int8 against activations quantized on the fly) no probed matmul rate stands for."""
        dtype = {"F16": "fp16", "BF16": "bf16"}.get(self.gguf_type)
        return {"quant": "none", "dtype": dtype, "page_size": 256} if dtype else None

    def reads_calibration(self) -> bool:
        """Never: llama.cpp's quantizer is run without an importance matrix (autotune/llamacpp/gguf_files.py)."""
        return False

    def scheme_label(self) -> str:
        return f"gguf:{self.gguf_type}"

    def label(self, batch_size: int, device_power: int) -> str:
        return (f"llama.cpp {self.gguf_type}/fa={self.flash_attn}/kv={self.kv_type}/np={batch_size}/b={self.n_batch}"
                f"/ub={self.n_ubatch}/c={self.n_ctx}/t={device_power or 'all'}")


_DEFAULTS = {name: getattr(LlamaCppKnobs(), name) for name in LlamaCppKnobs.__dataclass_fields__}
