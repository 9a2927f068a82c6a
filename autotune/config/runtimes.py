"""What can run a model, and which knobs belong to each: autotune's own engine (torch) and llama.cpp (a GGUF file,
through llama-cpp-python in trials and llama-server in serving). The one place that tells the runtimes apart: a
configuration, a space file, a backend and a recipe name a runtime, and whatever differs between runtimes is
asked of the Runtime here, never branched on by name elsewhere.

Kept free of the configuration class (autotune/config/deploy.py uses this module): a Runtime reads a configuration's
knobs by attribute."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Runtime", "RUNTIMES", "DEFAULT_RUNTIME", "SHARED_KNOBS", "ENGINE_KNOBS", "LLAMACPP_KNOBS", "runtime_of",
           "other_knobs"]

# Every runtime's: the sequences decoded together (the engine's batch, llama.cpp's parallel sequences) and the
# device power level (on the CPU, the threads).
SHARED_KNOBS = ("batch_size", "device_power")
ENGINE_KNOBS = ("dtype", "quant", "quant_method", "fallback_layers", "fusion_level", "layers_per_subgraph",
                "page_size", "kv_policy")
# llama.cpp's own: the GGUF file's type, the most tokens one decode call takes (n_batch) and one compute graph runs
# (n_ubatch), the attention kernel, the KV cache's type and its size in tokens (0: the model's trained context),
# shared by the parallel sequences.
LLAMACPP_KNOBS = ("gguf_type", "n_batch", "n_ubatch", "flash_attn", "kv_type", "n_ctx")


@dataclass(frozen=True)
class Runtime:
    """`knobs`: its own (besides SHARED_KNOBS); `server`: what serves its recipes; `torch_engine`: whether autotune's
    engine builds it in this process (trials, `verify`, `serve`), or a server of its own runs it; `space_file`: its
    default space under search_spaces/; `named`: whether a stored configuration names it (the engine's predate
    runtimes and do not, so that they read, digest and key as before)."""

    name: str
    knobs: tuple[str, ...]
    server: str
    torch_engine: bool
    space_file: str
    named: bool = True

    def scheme_label(self, config) -> str:
        raise NotImplementedError

    def label(self, config) -> str:
        raise NotImplementedError


class _Engine(Runtime):
    def scheme_label(self, config) -> str:
        """The precision alone ("fp32") for quant none, else the scheme with its method and fallback where they are
        not the defaults and the precision it computes in: "w4a16+awq+fb2@bf16"."""
        if config.quant == "none":
            return config.dtype
        method = "" if config.quant_method == "rtn" else f"+{config.quant_method}"
        fallback = f"+fb{config.fallback_layers}" if config.fallback_layers else ""
        return f"{config.quant}{method}{fallback}@{config.dtype}"

    def label(self, config) -> str:
        split = "" if config.layers_per_subgraph is None else f"/split={config.layers_per_subgraph or 'all'}"
        return (f"{self.scheme_label(config)}/{config.fusion_level}{split}/bs={config.batch_size}"
                f"/page={config.page_size}/{config.kv_policy}/power={config.device_power}")


class _LlamaCpp(Runtime):
    def scheme_label(self, config) -> str:
        return f"gguf:{config.gguf_type}"

    def label(self, config) -> str:
        return (f"llama.cpp {config.gguf_type}/fa={config.flash_attn}/kv={config.kv_type}/np={config.batch_size}"
                f"/b={config.n_batch}/ub={config.n_ubatch}/c={config.n_ctx}/t={config.device_power or 'all'}")


DEFAULT_RUNTIME = "engine"
RUNTIMES: dict[str, Runtime] = {
    "engine": _Engine("engine", ENGINE_KNOBS, server="autotune's engine (autotune serve)", torch_engine=True,
                      space_file="default.yaml", named=False),
    "llamacpp": _LlamaCpp("llamacpp", LLAMACPP_KNOBS, server="llama-server", torch_engine=False,
                          space_file="llamacpp.yaml"),
}


def runtime_of(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"runtime must be one of {tuple(RUNTIMES)}, not {name!r}") from None


def other_knobs(name: str) -> tuple[str, ...]:
    """The knobs of every runtime but `name`: what a configuration or a space of `name` must not set."""
    return tuple(k for r in RUNTIMES.values() if r.name != name for k in r.knobs)
