"""The compiler's own cache, shared by every trial and worker on a machine: inductor's FX-graph and kernel caches
under autotune's cache root, and this process's hits and misses in it."""
from __future__ import annotations

from autotune.errors import UserInputError
from autotune.paths import cache_root, private_dir, untrusted

__all__ = ["compiler_cache_env", "compiler_cache_counts", "compile_seconds"]


def compiler_cache_env() -> dict[str, str]:
    """Environment for child jobs: one inductor cache for all trials and workers, so that a repeated build
    (same graph, same knobs) loads compiled kernels instead of compiling them again."""
    folder = private_dir(cache_root() / "inductor")  # compiled kernels are loaded into every trial: 0700
    if (why := untrusted(folder)) is not None:
        raise UserInputError(why)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}


def compiler_cache_counts() -> dict[str, int]:
    """Inductor's FX-graph cache hits and misses in this process (call at the end of a job), the graphs it did not
    cache at all (bypasses: every frozen O2 graph on the CPU, whose oneDNN-prepacked weights it cannot pickle), and
    the graphs that mode max-autotune meant to replay as CUDA graphs but ran without them (inductor's "skipping
    cudagraphs due to ..." log line, counted), so that a trial shows it rather than a log nobody reads."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    inductor = counters.get("inductor", {})
    return {"hits": int(inductor.get("fxgraph_cache_hit", 0)), "misses": int(inductor.get("fxgraph_cache_miss", 0)),
            "bypasses": int(inductor.get("fxgraph_cache_bypass", 0)),
            "cudagraph_skips": int(inductor.get("cudagraph_skips", 0))}


def compile_seconds() -> float:
    """Seconds this process spent compiling graphs (dynamo tracing and inductor code generation, cache loads
    included), from torch's own compile timers."""
    try:
        from torch._dynamo.utils import compile_times
    except ImportError:
        return 0.0
    names, values = compile_times(repr="csv")
    return sum(float(v) for name, cell in zip(names, values) if name == "_compile.compile_inner"
               for v in str(cell).split(",") if v.strip())
