"""Which llama.cpp this is: llama-cpp-python's version, the llama.cpp commit it vendors and the flags it was built
with (scripts/build_llamacpp.sh writes them to BUILD_INFO beside the tools), and what the library says it uses."""
from __future__ import annotations

from pathlib import Path

from autotune.paths import cache_root

__all__ = ["llamacpp_versions", "tools_dir", "installed"]


def installed() -> str | None:
    """llama-cpp-python's version, or None where it is not installed (found without loading the library)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llama-cpp-python")
    except PackageNotFoundError:
        return None


def tools_dir(version: str | None = None) -> Path:
    """Where scripts/build_llamacpp.sh puts llama-server, llama-quantize and llama-batched-bench of a version."""
    return cache_root() / "llamacpp" / (version or installed() or "none") / "bin"


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
