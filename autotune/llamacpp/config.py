"""One llama.cpp deployment: the knobs llama-server takes, frozen and validated, and the command line that serves
it. Kept free of llama_cpp: a study's process builds and stores these without loading the library."""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields

__all__ = ["LlamaCppConfig", "GGUF_TYPES", "KV_TYPES", "FLASH_ATTN", "SERVER_DEFAULTS"]

# "source": the model's own GGUF as shipped (SmolLM2's is Q4_1); the others are made from it once per model with
# llama.cpp's quantizer (autotune/llamacpp/gguf_files.py) and cached.
GGUF_TYPES = ("source", "Q4_0", "Q4_K_M", "Q8_0", "F16", "BF16")
# The KV cache's storage type (K and V alike). A quantized V cache needs flash attention (llama.cpp refuses it
# otherwise), which the search space says with a `when`.
KV_TYPES = ("f16", "q8_0")
FLASH_ATTN = ("on", "off", "auto")


@dataclass(frozen=True, slots=True)
class LlamaCppConfig:
    """`threads` 0: all cores. `n_ctx` is the whole KV cache in tokens (0: the context the model was trained with),
    shared by the `parallel` sequences (a unified cache, as llama-server runs with its default --parallel).
    `n_batch`: the most tokens one decode call takes (prompt chunks and decode steps together); `n_ubatch`: what one
    compute graph runs at a time."""

    gguf_type: str = "source"
    threads: int = 0
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: str = "auto"
    kv_type: str = "f16"
    parallel: int = 8
    n_ctx: int = 4096

    def __post_init__(self) -> None:
        if self.gguf_type not in GGUF_TYPES:
            raise ValueError(f"gguf_type must be one of {GGUF_TYPES}, not {self.gguf_type!r}")
        if self.kv_type not in KV_TYPES:
            raise ValueError(f"kv_type must be one of {KV_TYPES}, not {self.kv_type!r}")
        if self.flash_attn not in FLASH_ATTN:
            raise ValueError(f"flash_attn must be one of {FLASH_ATTN}, not {self.flash_attn!r}")
        if self.kv_type != "f16" and self.flash_attn == "off":
            raise ValueError(f"a {self.kv_type} KV cache needs flash attention (llama.cpp quantizes V only in it)")
        if self.threads < 0 or self.parallel < 1 or self.n_ctx < 0:
            raise ValueError("threads and n_ctx must be >= 0, parallel >= 1")
        if not 1 <= self.n_ubatch <= self.n_batch:
            raise ValueError(f"need 1 <= n_ubatch <= n_batch, not {self.n_ubatch}, {self.n_batch}")

    @classmethod
    def from_dict(cls, data: dict) -> LlamaCppConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown llama.cpp configuration keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)

    def numerics_key(self) -> dict:
        """What changes the logits: the weights' type, the KV cache's type and the attention kernel. Threads and
        batch sizes only split the same sums differently (llama.cpp reduces each dot product in one thread)."""
        return {"gguf_type": self.gguf_type, "kv_type": self.kv_type, "flash_attn": self.flash_attn}

    def label(self) -> str:
        return (f"{self.gguf_type}/fa={self.flash_attn}/kv={self.kv_type}/np={self.parallel}/b={self.n_batch}"
                f"/ub={self.n_ubatch}/c={self.n_ctx}/t={self.threads or 'all'}")

    def server_args(self, model_path: str, threads: int, host: str = "127.0.0.1", port: int = 8080) -> list[str]:
        """llama-server's arguments for this configuration (after the executable), as a recipe records them.
        `threads`: the resolved thread count (this config's, or all cores for 0)."""
        return ["-m", model_path, "--host", host, "--port", str(port), "-t", str(threads), "-tb", str(threads),
                "-c", str(self.n_ctx), "-np", str(self.parallel), "--kv-unified", "-cb", "-b", str(self.n_batch),
                "-ub", str(self.n_ubatch), "-fa", self.flash_attn, "-ctk", self.kv_type, "-ctv", self.kv_type]

    def server_command(self, model_path: str, threads: int, port: int = 8080) -> str:
        return shlex.join(["llama-server", *self.server_args(model_path, threads, port=port)])


# What llama-server runs with when given only a model (this llama.cpp's common.h and server.cpp): the context the
# model was trained with (0), --parallel auto = 4 slots over a unified cache, batch 2048/512, flash attention auto,
# an f16 KV cache.
SERVER_DEFAULTS = LlamaCppConfig(gguf_type="source", threads=0, n_batch=2048, n_ubatch=512, flash_attn="auto",
                                 kv_type="f16", parallel=4, n_ctx=0)
