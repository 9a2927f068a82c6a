"""Caches shared by every trial and worker on a machine: the gate figures (autotune/gatecache.py) and the
compiler's own cache (inductor's FX-graph and kernel caches under autotune's cache root), with their hit rates."""
from __future__ import annotations

import optuna

from autotune.weights import cache_root

__all__ = ["compiler_cache_env", "compiler_cache_counts", "hit_rates", "record_hit_rates"]


def compiler_cache_env() -> dict[str, str]:
    """Environment for child jobs: one inductor cache for all trials and workers, so that a repeated build
    (same graph, same knobs) loads compiled kernels instead of compiling them again."""
    folder = cache_root() / "inductor"
    folder.mkdir(parents=True, exist_ok=True)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder), "TORCHINDUCTOR_FX_GRAPH_CACHE": "1"}


def compiler_cache_counts() -> dict[str, int]:
    """Inductor's FX-graph cache hits and misses in this process (call at the end of a job)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:
        return {}
    inductor = counters.get("inductor", {})
    return {"hits": int(inductor.get("fxgraph_cache_hit", 0)), "misses": int(inductor.get("fxgraph_cache_miss", 0))}


def hit_rates(trials: list[optuna.trial.FrozenTrial]) -> dict[str, dict]:
    """Gate: trials whose gate came from the cache, over trials that needed a gate. Compiler: FX-graph loads
    from the cache over all graph compilations. Duplicates (which reuse a whole result) are counted apart."""
    gate_hits = gate_lookups = compile_hits = compile_lookups = duplicates = 0
    for t in trials:
        attrs = t.user_attrs
        if "duplicate_of" in attrs:
            duplicates += 1
            continue
        if "gate_cached" in attrs:
            gate_lookups += 1
            gate_hits += bool(attrs["gate_cached"])
        counts = attrs.get("compile_cache") or {}
        compile_hits += counts.get("hits", 0)
        compile_lookups += counts.get("hits", 0) + counts.get("misses", 0)

    def rate(hits: int, lookups: int) -> dict:
        return {"hits": hits, "lookups": lookups, "rate": round(hits / lookups, 3) if lookups else None}

    return {"gate": rate(gate_hits, gate_lookups), "compiler": rate(compile_hits, compile_lookups),
            "duplicate_results_reused": duplicates}


def record_hit_rates(study: optuna.Study) -> None:
    """Recomputed from all trials each time, so that concurrent workers never lose each other's counts."""
    study.set_user_attr("cache_hit_rates", hit_rates(study.get_trials(deepcopy=False)))
