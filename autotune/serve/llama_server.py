"""Serving a llama.cpp recipe: llama-server itself, with the command line the recipe records (its model path made
here when it is not: the GGUF of the recipe's type, from the model's own file). autotune's server never stands
in front of it: llama-server has its own HTTP API (OpenAI's /v1/completions, /health, /metrics with --metrics).

What is exec'd is what the recipe was measured with: the GGUF's sha256 and the llama-server binary's (its version
line for the message) are recorded in the recipe and compared before execv; a mismatch is refused in one line that
says how to rebuild. A recipe exported before they were recorded is served with a warning that it was not checked."""
from __future__ import annotations

import os
import shlex
from pathlib import Path

from autotune.errors import UserInputError
from autotune.host import num_cores
from autotune.llamacpp.build_info import find_llama_server, installed, tools_dir
from autotune.llamacpp.config import llamacpp_config, server_args
from autotune.llamacpp.gguf_files import gguf_file
from autotune.models.registry import resolve_model
from autotune.models.weights import model_checksum
from autotune.paths import file_sha256
from autotune.progress import log
from autotune.recipes.recipe import Recipe

__all__ = ["llama_server_binary", "llama_server_argv", "check_llama_server", "serve_with_llama_server",
           "API_KEY_ENV"]

# llama-server reads its --api-key from this variable: the key stays out of the process list.
API_KEY_ENV = "LLAMA_API_KEY"
_REBUILD = "bash scripts/build_llamacpp.sh"


def llama_server_binary() -> Path:
    """scripts/build_llamacpp.sh's llama-server, else one on PATH; a UserInputError saying how to get one where
    there is none."""
    found = find_llama_server()
    if found is None:
        raise UserInputError(f"this recipe is served by llama.cpp's llama-server, which is not built here (looked "
                             f"in {tools_dir()} and on PATH): {_REBUILD} builds it")
    return found


def llama_server_argv(recipe: Recipe, host: str, port: int, force: bool = False) -> list[str]:
    """llama-server's arguments (after the executable) for the recipe's configuration on this machine: its GGUF
    (made here where the recorded path is absent), its threads, and `host`/`port`."""
    config = llamacpp_config(recipe.config)
    spec = resolve_model(recipe.model)
    checksum = model_checksum(spec)
    if checksum != recipe.data["model"]["checksum"] and not force:
        raise UserInputError(f"the weights of {recipe.model} here ({checksum}) are not the ones the recipe was made "
                             f"for ({recipe.data['model']['checksum']}); pass --force to serve anyway")
    recorded = shlex.split(recipe.data["deploy"].get("llama_server", ""))
    model = Path(recorded[recorded.index("-m") + 1]) if "-m" in recorded[:-1] else None
    if model is None or not model.is_file():
        model = gguf_file(spec, checksum, config.gguf_type, config.device_power)
    return server_args(config, str(model), config.device_power or num_cores(), host=host, port=port)


def check_llama_server(recipe: Recipe, binary: Path, model: Path, force: bool = False) -> None:
    """Refuse (one line, how to rebuild) a GGUF or a llama-server that is not the one the recipe recorded; with
    `force`, say so and go on. A recipe that recorded neither is served with a warning."""
    deploy = recipe.data["deploy"]
    want_gguf, want_server = deploy.get("gguf_sha256"), deploy.get("llama_server_sha256")
    problems = []
    if want_gguf is None:
        log(f"serve: {recipe.path} records no sha256 of its GGUF (exported before it was recorded): {model} is "
            "not checked; re-export the recipe to have it checked")
    elif (got := file_sha256(model)) != want_gguf:
        problems.append(f"the GGUF {model} has sha256 {got[:16]}, not the recipe's {want_gguf[:16]} (replaced or "
                        f"corrupted): delete it to have it made again from {recipe.model}'s own file, or re-run "
                        "the study that made the recipe and export it again")
    if want_server is None:
        log(f"serve: {recipe.path} records no llama-server digest (exported before it was recorded, or none was "
            f"built when it was measured): {binary} is not checked")
    elif (got := file_sha256(binary)) != want_server:
        version = deploy.get("llama_server_version", "version unknown")
        problems.append(f"{binary} has sha256 {got[:16]}, not the recipe's {want_server[:16]} ({version}, "
                        f"llama-cpp-python {recipe.data.get('software', {}).get('llama_cpp_python', '?')}; "
                        f"installed here: {installed() or 'none'}): rebuild it with {_REBUILD}, or re-run the "
                        "study with this build and export the recipe again")
    if problems and not force:
        raise UserInputError(f"refusing to exec llama-server for {recipe.path}: {'; '.join(problems)}; --force "
                             "serves it anyway")
    for problem in problems:
        log(f"serve: --force: {problem}")


def serve_with_llama_server(recipe: Recipe, host: str, port: int, force: bool, api_key: str | None = None) -> int:
    """Replace this process with llama-server: signals, logs and exit status are then llama-server's own."""
    binary = llama_server_binary()
    argv = [str(binary), *llama_server_argv(recipe, host, port, force)]
    check_llama_server(recipe, binary, Path(argv[argv.index("-m") + 1]), force)
    env = {**os.environ, **({API_KEY_ENV: api_key} if api_key else {})}
    log(f"serve: {recipe.config.label()} is served by llama.cpp{' with an API key' if api_key else ''}: "
        f"{shlex.join(argv)}")
    os.execve(argv[0], argv, env)
    return 0  # not reached: execve returns only by raising
