"""How often the caches saved work in a study: gate figures reused (autotune/gate/cache.py), compiled graphs loaded
from inductor's cache (autotune/trial/compiler_cache.py), whole results of duplicate configurations reused."""
from __future__ import annotations

import optuna

__all__ = ["hit_rates", "record_hit_rates"]


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
