"""Serving a llama.cpp recipe: llama-server itself, with the command line the recipe records (its model path made
here when it is not: the GGUF of the recipe's type, from the model's own file). autotune's server never stands
in front of it: llama-server has its own HTTP API (OpenAI's /v1/completions, /health, /metrics with --metrics)."""
from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from autotune.errors import UserInputError
from autotune.host import num_cores
from autotune.llamacpp.build_info import tools_dir
from autotune.llamacpp.config import LlamaCppConfig
from autotune.llamacpp.gguf_files import gguf_file
from autotune.models.registry import resolve_model
from autotune.models.weights import model_checksum
from autotune.progress import log
from autotune.recipes.recipe import Recipe

__all__ = ["llama_server_binary", "llama_server_argv", "serve_with_llama_server"]


def llama_server_binary() -> Path:
    """scripts/build_llamacpp.sh's llama-server (built from the same source as the installed binding), else one on
    PATH; a UserInputError saying how to get one where there is none."""
    built = tools_dir() / "llama-server"
    if built.is_file():
        return built
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    raise UserInputError(f"this recipe is served by llama.cpp's llama-server, which is not built here (looked in "
                         f"{built.parent} and on PATH): bash scripts/build_llamacpp.sh builds it")


def llama_server_argv(recipe: Recipe, host: str, port: int, force: bool = False) -> list[str]:
    """llama-server's arguments (after the executable) for the recipe's configuration on this machine: its GGUF
    (made here where the recorded path is absent), its threads, and `host`/`port`."""
    config = LlamaCppConfig.of(recipe.config)
    spec = resolve_model(recipe.model)
    checksum = model_checksum(spec)
    if checksum != recipe.data["model"]["checksum"] and not force:
        raise UserInputError(f"the weights of {recipe.model} here ({checksum}) are not the ones the recipe was made "
                             f"for ({recipe.data['model']['checksum']}); pass --force to serve anyway")
    recorded = shlex.split(recipe.data["deploy"].get("llama_server", ""))
    model = Path(recorded[recorded.index("-m") + 1]) if "-m" in recorded[:-1] else None
    if model is None or not model.is_file():
        model = gguf_file(spec, checksum, config.gguf_type, config.threads)
    return config.server_args(str(model), config.threads or num_cores(), host=host, port=port)


def serve_with_llama_server(recipe: Recipe, host: str, port: int, force: bool) -> int:
    """Replace this process with llama-server: signals, logs and exit status are then llama-server's own."""
    binary = llama_server_binary()
    argv = [str(binary), *llama_server_argv(recipe, host, port, force)]
    log(f"serve: {recipe.config.label()} is served by llama.cpp: {shlex.join(argv)}")
    os.execv(argv[0], argv)
    return 0  # not reached: execv returns only by raising
