"""The frozen deployment configuration: one point of the search space, validated on construction. It is the
shared knobs (batch, device power) and one runtime's own (config/engine_knobs.py, config/llamacpp_knobs.py,
config/openvino_knobs.py), read
through it by name: `config.quant` is its engine knob, and asking a llama.cpp configuration for it is an error."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, fields, replace

from autotune.config.engine_knobs import (
    DTYPE_BYTES,
    DTYPES,
    FALLBACK_LAYERS,
    FUSION_LEVELS,
    KV_POLICIES,
    LEGACY_SCHEMES,
    QUANT_METHODS,
    QUANT_SCHEMES,
    TORCH_DTYPE_NAMES,
    EngineKnobs,
)
from autotune.config.llamacpp_knobs import FLASH_ATTN, GGUF_TYPES, KV_TYPES, LlamaCppKnobs
from autotune.config.openvino_knobs import OpenVinoKnobs
from autotune.config.runtimes import (
    DEFAULT_RUNTIME,
    ENGINE_KNOBS,
    LLAMACPP_KNOBS,
    RUNTIMES,
    SHARED_KNOBS,
    Knobs,
    runtime_of,
)

__all__ = ["DeployConfig", "NUMERICS_KNOBS", "DTYPES", "DTYPE_BYTES", "TORCH_DTYPE_NAMES", "QUANT_SCHEMES",
           "QUANT_METHODS", "FALLBACK_LAYERS", "FUSION_LEVELS", "KV_POLICIES", "RUNTIMES", "LLAMACPP_KNOBS",
           "ENGINE_KNOBS", "GGUF_TYPES", "KV_TYPES", "FLASH_ATTN", "EngineKnobs", "LlamaCppKnobs",
           "OpenVinoKnobs"]

# Every runtime's knobs that change what the model computes (each knob class's NUMERICS), and the runtime itself.
NUMERICS_KNOBS = ("runtime", *(k for r in RUNTIMES.values() for k in r.knob_class.NUMERICS))
# Every runtime's knobs at their defaults: what a stored configuration may carry of another runtime's (configurations
# once held every knob) and have dropped.
_KNOB_DEFAULTS = {f.name: f.default for r in RUNTIMES.values() for f in fields(r.knob_class)}
_KNOWN = {"runtime", *SHARED_KNOBS, *_KNOB_DEFAULTS}


def _upgraded(values: dict) -> dict:
    """A copy of stored configuration values with a scheme name from before the dtype knob replaced."""
    out = dict(values)
    if out.get("quant") in LEGACY_SCHEMES:
        out["quant"], legacy_dtype = LEGACY_SCHEMES[out["quant"]]
        out.setdefault("dtype", legacy_dtype)
    return out


@dataclass(frozen=True, slots=True, init=False)
class DeployConfig:
    """How one model is deployed: `batch_size` sequences decoded together (llama.cpp's parallel sequences),
    `device_power` a backend-defined level (on the CPU the number of threads, 0: all cores), and `knobs`, the
    runtime's own. Built from keywords, `DeployConfig(quant="w8a16", batch_size=16)`, the runtime named where it
    is not the engine: `DeployConfig(runtime="llamacpp", gguf_type="Q8_0")`."""

    knobs: Knobs
    batch_size: int
    device_power: int

    def __init__(self, knobs: Knobs | None = None, *, runtime: str | None = None, batch_size: int = 8,
                 device_power: int = 0, **values) -> None:
        own = runtime_of(runtime or (knobs.RUNTIME if knobs is not None else DEFAULT_RUNTIME))
        if knobs is not None and knobs.RUNTIME != own.name:
            raise ValueError(f"knobs of the {knobs.RUNTIME} runtime given for the {own.name} runtime")
        unknown = sorted(set(values) - _KNOWN)
        if unknown:
            raise ValueError(f"unknown configuration keys {unknown}; known: {sorted(_KNOWN)}")
        # Another runtime's knob away from its default would be recorded but never applied.
        stray = [k for k, v in values.items() if k not in own.knobs and v != _KNOB_DEFAULTS[k]]
        if stray:
            raise ValueError(f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to the "
                             f"{own.name} runtime")
        mine = {k: v for k, v in values.items() if k in own.knobs}
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {batch_size}")
        if device_power < 0:
            raise ValueError(f"device_power must be >= 0, not {device_power}")
        object.__setattr__(self, "knobs", own.knob_class(**mine) if knobs is None else replace(knobs, **mine))
        object.__setattr__(self, "batch_size", batch_size)
        object.__setattr__(self, "device_power", device_power)

    def __getattr__(self, name: str):
        """The runtime's knob `name` (only reached for what is not an attribute of the configuration itself)."""
        knobs = object.__getattribute__(self, "knobs")
        if name in knobs.__dataclass_fields__:
            return getattr(knobs, name)
        raise AttributeError(f"a configuration of the {knobs.RUNTIME} runtime has no knob {name!r}")

    @property
    def runtime(self) -> str:
        return self.knobs.RUNTIME

    @classmethod
    def from_dict(cls, data: dict) -> DeployConfig:
        """From a stored configuration (a trial's `config`, a recipe's `configuration`), including those written
        before the dtype knob: their scheme "bf16" is quant "none" computing in bf16."""
        return cls(**_upgraded(data))

    @classmethod
    def of_runtime(cls, runtime: str, config: DeployConfig | dict, what: str) -> DeployConfig:
        """`config` (or a stored one), refused where it is not of `runtime` (`what`: its name in words)."""
        config = config if isinstance(config, DeployConfig) else cls.from_dict(config)
        if config.runtime != runtime:
            raise ValueError(f"{config.label()} is a configuration of the {config.runtime} runtime, not of {what}")
        return config

    @classmethod
    def from_params(cls, params: dict) -> DeployConfig:
        """From search-space parameters, where layers_per_subgraph may be the string "all"."""
        values = _upgraded(params)
        lps = values.get("layers_per_subgraph")
        if lps == "all":
            values["layers_per_subgraph"] = 0
        elif lps is not None:
            values["layers_per_subgraph"] = int(lps)
        if "layers_per_subgraph" in values and values.get("fusion_level", "O0") == "O0":
            values["layers_per_subgraph"] = None
        return cls(**values)

    def to_dict(self) -> dict:
        """The runtime's own knobs and the shared ones, the runtime named unless it is the default: a configuration
        of the engine reads as it did before llama.cpp's knobs existed, one of llama.cpp carries none of the
        engine's."""
        own = RUNTIMES[self.runtime]
        values = {k: getattr(self.knobs, k) for k in own.knobs}
        values.update(batch_size=self.batch_size, device_power=self.device_power)
        if own.named:
            values["runtime"] = own.name
        return values

    def numerics_key(self) -> str:
        """Stable key of the knobs that change numerics (the runtime's NUMERICS, and the runtime where named)."""
        values = self.to_dict()
        names = ("runtime", *self.knobs.NUMERICS)
        return json.dumps(self.knobs.keyed({k: values[k] for k in names if k in values}), sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.knobs.keyed(self.to_dict()), sort_keys=True).encode()).hexdigest()[:12]

    def scheme_label(self) -> str:
        """The numerics in a word: "fp32", "w4a16+awq+fb2@bf16", "gguf:Q8_0" (its knob class's)."""
        return self.knobs.scheme_label()

    def label(self) -> str:
        return self.knobs.label(self.batch_size, self.device_power)
