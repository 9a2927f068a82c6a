"""Which llama.cpp this is: llama-cpp-python's version, the llama.cpp commit it vendors and the flags it was built
with (scripts/build_llamacpp.sh writes them to BUILD_INFO beside the tools), and what the library says it uses."""
from __future__ import annotations

import hashlib
import importlib.util
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from autotune.gate.cache import numerics_versions as torch_numerics_versions
from autotune.paths import cache_root, file_sha256

__all__ = ["llamacpp_versions", "tools_dir", "installed", "build_id", "numerics_versions", "find_llama_server",
           "server_identity", "SERVER_FIELDS"]

# What a recipe records of the llama-server that serves it and of its GGUF (recipes/recipe.py moves them from the
# trial's versions into the recipe's deploy section; serve/llama_server.py checks them before it execs).
SERVER_FIELDS = ("gguf_sha256", "llama_server_version", "llama_server_sha256")


def installed() -> str | None:
    """llama-cpp-python's version, or None where it is not installed (found without loading the library)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


@lru_cache(maxsize=1)
def build_id() -> str | None:
    """The installed llama.cpp build's identity: a digest of llama-cpp-python's shared libraries, found without
    loading them. One version is built with this CPU's instructions or without them (a wheel, a source build, a
    build by scripts/build_llamacpp.sh), and each build's kernels round differently."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    digest = hashlib.sha256()
    for path in sorted(Path(next(iter(spec.submodule_search_locations))).glob("lib/*.so*")):
        if path.is_symlink():
            continue
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def numerics_versions() -> dict[str, str | None]:
    """What a llama.cpp gate's figures were computed with, for its cache key (autotune/gate/cache.py): the versions
    a torch gate is keyed by (the reference is computed with them) and llama.cpp's own."""
    return {**torch_numerics_versions(), "llama_cpp_python": installed(), "llama_cpp_build": build_id()}


def tools_dir(version: str | None = None) -> Path:
    """Where scripts/build_llamacpp.sh puts llama-server, llama-quantize and llama-batched-bench of a version."""
    return cache_root() / "llamacpp" / (version or installed() or "none") / "bin"


def find_llama_server() -> Path | None:
    """scripts/build_llamacpp.sh's llama-server (built from the same source as the installed binding), else one on
    PATH, else None."""
    built = tools_dir() / "llama-server"
    if built.is_file():
        return built
    found = shutil.which("llama-server")
    return Path(found) if found else None


def server_identity(gguf: Path) -> dict[str, str]:
    """The GGUF's sha256, and the version line and sha256 of the llama-server that would serve it (where there
    is one), as a recipe records them."""
    out = {"gguf_sha256": file_sha256(gguf)}
    binary = find_llama_server()
    if binary is not None:
        try:
            ran = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60)
            text = ran.stdout + ran.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"version: unknown ({exc})"
        out["llama_server_version"] = next((line.strip() for line in text.splitlines()
                                            if line.startswith("version:")), "version: unknown")
        out["llama_server_sha256"] = file_sha256(binary)
    return out


def llamacpp_versions() -> dict:
    import llama_cpp

    out: dict = {"llama_cpp_python": llama_cpp.__version__,
                 "system_info": llama_cpp.llama_print_system_info().decode().strip()}
    info = tools_dir(llama_cpp.__version__).parent / "BUILD_INFO"
    if info.is_file():
        for line in info.read_text().splitlines():
            key, _, value = line.partition(": ")
            out[f"build_{key}" if key != "llama_cpp" else key] = value
    else:
        out["build"] = "not built by scripts/build_llamacpp.sh: flags unknown"
    return out
