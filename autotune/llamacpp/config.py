"""One llama.cpp deployment: the knobs llama-server takes, frozen and validated, and the command line that serves
it. Kept free of llama_cpp: a study's process builds and stores these without loading the library."""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, fields

from autotune.config.deploy import LLAMACPP_KNOBS, DeployConfig, check_llamacpp_knobs

__all__ = ["LlamaCppConfig", "SERVER_DEFAULTS", "LLAMACPP"]

# This runtime's name (autotune/config/runtimes.py).
LLAMACPP = "llamacpp"


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
        check_llamacpp_knobs(*(getattr(self, k) for k in LLAMACPP_KNOBS))
        if self.threads < 0 or self.parallel < 1:
            raise ValueError("threads must be >= 0, parallel >= 1")

    @classmethod
    def of(cls, config: DeployConfig) -> LlamaCppConfig:
        """A study's configuration (runtime llamacpp) in llama.cpp's terms: batch_size is the parallel sequences,
        device_power the threads."""
        if config.runtime != LLAMACPP:
            raise ValueError(f"{config.label()} is a configuration of the {config.runtime} runtime, not of llama.cpp")
        return cls(threads=config.device_power, parallel=config.batch_size,
                   **{k: getattr(config, k) for k in LLAMACPP_KNOBS})

    def deploy(self) -> DeployConfig:
        """The same knobs as a study's configuration (of() inverted)."""
        return DeployConfig(runtime=LLAMACPP, batch_size=self.parallel, device_power=self.threads,
                            **{k: getattr(self, k) for k in LLAMACPP_KNOBS})

    @classmethod
    def from_dict(cls, data: dict) -> LlamaCppConfig:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown llama.cpp configuration keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**data)

    def to_dict(self) -> dict:
        return asdict(self)

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
