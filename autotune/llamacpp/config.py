"""One llama.cpp deployment as llama-server runs it: a DeployConfig of the llamacpp runtime (its knobs are
config/llamacpp_knobs.py's; batch_size is the parallel sequences, device_power the threads) and the command line
that serves it. Kept free of llama_cpp: a study's process builds and stores these without loading the library."""
from __future__ import annotations

import shlex

from autotune.config.deploy import DeployConfig, LlamaCppKnobs

__all__ = ["LLAMACPP", "SERVER_DEFAULTS", "llamacpp_config", "server_args", "server_command"]

# This runtime's name (autotune/config/runtimes.py).
LLAMACPP = LlamaCppKnobs.RUNTIME


def llamacpp_config(config: DeployConfig | dict) -> DeployConfig:
    """`config` (or a stored one), refused where it is another runtime's."""
    return DeployConfig.of_runtime(LLAMACPP, config, "llama.cpp")


def server_args(config: DeployConfig, model_path: str, threads: int, host: str = "127.0.0.1",
                port: int = 8080) -> list[str]:
    """llama-server's arguments for `config` (after the executable), as a recipe records them. `threads`: the
    resolved thread count (the configuration's, or all cores for 0)."""
    k = llamacpp_config(config).knobs
    return ["-m", model_path, "--host", host, "--port", str(port), "-t", str(threads), "-tb", str(threads),
            "-c", str(k.n_ctx), "-np", str(config.batch_size), "--kv-unified", "-cb", "-b", str(k.n_batch),
            "-ub", str(k.n_ubatch), "-fa", k.flash_attn, "-ctk", k.kv_type, "-ctv", k.kv_type]


def server_command(config: DeployConfig, model_path: str, threads: int, port: int = 8080) -> str:
    return shlex.join(["llama-server", *server_args(config, model_path, threads, port=port)])


# What llama-server runs with when given only a model (this llama.cpp's common.h and server.cpp): the context the
# model was trained with (0), --parallel auto = 4 slots over a unified cache, batch 2048/512, flash attention auto,
# an f16 KV cache, every core.
SERVER_DEFAULTS = DeployConfig(runtime=LLAMACPP, batch_size=4, device_power=0, gguf_type="source", n_batch=2048,
                               n_ubatch=512, flash_attn="auto", kv_type="f16", n_ctx=0)
