"""The frozen deployment configuration: one point of the search space, validated on construction."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

from autotune.config.runtimes import (
    DEFAULT_RUNTIME,
    ENGINE_KNOBS,
    LLAMACPP_KNOBS,
    RUNTIMES,
    other_knobs,
    runtime_of,
)

__all__ = ["DeployConfig", "NUMERICS_KNOBS", "DTYPES", "DTYPE_BYTES", "TORCH_DTYPE_NAMES", "QUANT_SCHEMES",
           "QUANT_METHODS", "FALLBACK_LAYERS", "FUSION_LEVELS", "KV_POLICIES", "RUNTIMES", "LLAMACPP_KNOBS",
           "ENGINE_KNOBS", "GGUF_TYPES", "KV_TYPES", "FLASH_ATTN", "check_llamacpp_knobs"]

# The storage and compute precision of everything a quantization scheme leaves unquantized: every layer under
# quant "none", the activations and arithmetic of the weight-only schemes, the kept (fallback) layers, the
# embedding and head, the KV cache. What a device computes natively is decided by its capability probe
# (autotune/probe/): bf16 on an AVX2-only CPU is emulated, several times slower than fp32.
DTYPES = ("fp32", "fp16", "bf16")
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# torch's names of them (getattr(torch, name)): this module stays free of torch.
TORCH_DTYPE_NAMES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# "none": the dtype alone. Recipes and studies made before the dtype knob named that scheme "bf16"
# (DeployConfig.from_dict reads them).
QUANT_SCHEMES = ("none", "w8a16", "w8a8", "w4a16")
# How each scheme's weights (and activation scales) are chosen. "rtn" (round-to-nearest, data-free) is what every
# scheme did before calibration existed; the others use the calibration set (autotune/quant/). "none" has none.
QUANT_METHODS: dict[str, tuple[str, ...]] = {
    "none": ("rtn",),
    "w8a16": ("rtn",),
    "w8a8": ("rtn", "smoothquant_static", "smoothquant_dynamic"),
    "w4a16": ("rtn", "awq"),
}
# How many of the most sensitive decoder linear layers a quantized scheme may keep in the compute dtype.
FALLBACK_LAYERS = (0, 1, 2, 4, 8)
FUSION_LEVELS = ("O0", "O1", "O2")
KV_POLICIES = ("preallocate", "on_demand", "pool")
# What runs the model (autotune/config/runtimes.py): autotune's own engine (torch), or llama.cpp on a GGUF file.
# Each has knobs the other has no meaning for; batch_size (llama.cpp's parallel sequences) and device_power (its
# threads) are shared.
# "source": the model's own GGUF as shipped (SmolLM2's is Q4_1); the others are made from it once per model with
# llama.cpp's quantizer (autotune/llamacpp/gguf_files.py) and cached.
GGUF_TYPES = ("source", "Q4_0", "Q4_K_M", "Q8_0", "F16", "BF16")
# The KV cache's storage type (K and V alike). A quantized V cache needs flash attention: llama.cpp refuses it
# otherwise.
KV_TYPES = ("f16", "q8_0")
# "auto": llama.cpp turns flash attention on where the device has the kernel (every CPU build has it).
FLASH_ATTN = ("auto", "on", "off")
# Only these change what the model computes; the rest change speed and memory. Gate results are keyed by them.
NUMERICS_KNOBS = ("runtime", "dtype", "quant", "fusion_level", "layers_per_subgraph", "quant_method",
                  "fallback_layers", "gguf_type", "kv_type", "flash_attn")
# Knobs added after recipes were first named by digest: left out of digest() and numerics_key() while at their
# defaults (DeployConfig's), so that a configuration that does not use them keeps its digest (and its recipe file
# name) and its gate key.
_LATER_KNOBS = ("quant_method", "fallback_layers", "dtype", "runtime", *LLAMACPP_KNOBS)
# The scheme names of configurations written before the dtype knob: old name -> (scheme, dtype).
_LEGACY_SCHEMES = {"bf16": ("none", "bf16")}



def check_llamacpp_knobs(gguf_type: str, n_batch: int, n_ubatch: int, flash_attn: str, kv_type: str,
                         n_ctx: int) -> None:
    """ValueError where llama.cpp would refuse the combination, said in its terms."""
    if gguf_type not in GGUF_TYPES:
        raise ValueError(f"gguf_type must be one of {GGUF_TYPES}, not {gguf_type!r}")
    if kv_type not in KV_TYPES:
        raise ValueError(f"kv_type must be one of {KV_TYPES}, not {kv_type!r}")
    if flash_attn not in FLASH_ATTN:
        raise ValueError(f"flash_attn must be one of {FLASH_ATTN}, not {flash_attn!r}")
    if kv_type != "f16" and flash_attn == "off":
        raise ValueError(f"a {kv_type} KV cache needs flash attention (llama.cpp quantizes V only in it)")
    if n_ctx < 0:
        raise ValueError(f"n_ctx must be >= 0 (0: the model's trained context), not {n_ctx}")
    if not 1 <= n_ubatch <= n_batch:
        raise ValueError(f"need 1 <= n_ubatch <= n_batch, not {n_ubatch}, {n_batch}")


def _upgraded(values: dict) -> dict:
    """A copy of stored configuration values with a scheme name from before the dtype knob replaced."""
    out = dict(values)
    if out.get("quant") in _LEGACY_SCHEMES:
        out["quant"], legacy_dtype = _LEGACY_SCHEMES[out["quant"]]
        out.setdefault("dtype", legacy_dtype)
    return out


@dataclass(frozen=True, slots=True)
class DeployConfig:
    """How one model is deployed. `layers_per_subgraph` is 0 for "all layers in one graph" and is only
    meaningful when fused (O1/O2); eager (O0) configurations carry None."""

    quant: str = "none"
    fusion_level: str = "O0"
    layers_per_subgraph: int | None = None
    batch_size: int = 8
    page_size: int = 128
    kv_policy: str = "on_demand"
    device_power: int = 0  # backend-defined level; on the CPU the number of threads (0: all cores)
    quant_method: str = "rtn"  # one of QUANT_METHODS[quant]
    fallback_layers: int = 0  # the most sensitive decoder linear layers kept in the compute dtype
    # Default bf16: what every configuration computed in before the knob existed, so that old ones read the same.
    dtype: str = "bf16"
    runtime: str = DEFAULT_RUNTIME  # one of RUNTIMES; the llamacpp backend's configurations are "llamacpp"
    # llama.cpp's knobs (LLAMACPP_KNOBS), at these defaults unless the runtime is llamacpp: llama-server's given
    # only a model, but for a context that holds the study's batch.
    gguf_type: str = "source"
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: str = "auto"
    kv_type: str = "f16"
    n_ctx: int = 4096

    def __post_init__(self) -> None:
        if self.quant in _LEGACY_SCHEMES:
            scheme, dtype = _LEGACY_SCHEMES[self.quant]
            raise ValueError(f"quant {self.quant!r} is now quant {scheme!r} with dtype {dtype!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if self.quant not in QUANT_SCHEMES:
            raise ValueError(f"quant must be one of {QUANT_SCHEMES}, not {self.quant!r}")
        if self.quant_method not in QUANT_METHODS[self.quant]:
            raise ValueError(f"quant_method for {self.quant} must be one of {QUANT_METHODS[self.quant]}, "
                             f"not {self.quant_method!r}")
        if self.fallback_layers < 0 or (self.quant == "none" and self.fallback_layers):
            raise ValueError(f"fallback_layers must be >= 0, and 0 for quant none (nothing is quantized); "
                             f"not {self.fallback_layers}")
        if self.fusion_level not in FUSION_LEVELS:
            raise ValueError(f"fusion_level must be one of {FUSION_LEVELS}, not {self.fusion_level!r}")
        if self.fusion_level == "O0" and self.layers_per_subgraph is not None:
            raise ValueError("layers_per_subgraph applies only to fused levels (O1, O2)")
        if self.fusion_level != "O0" and (self.layers_per_subgraph is None or self.layers_per_subgraph < 0):
            raise ValueError("fused levels need layers_per_subgraph >= 1, or 0 for all layers")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, not {self.batch_size}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, not {self.page_size}")
        if self.kv_policy not in KV_POLICIES:
            raise ValueError(f"kv_policy must be one of {KV_POLICIES}, not {self.kv_policy!r}")
        if self.device_power < 0:
            raise ValueError(f"device_power must be >= 0, not {self.device_power}")
        runtime_of(self.runtime)
        check_llamacpp_knobs(*(getattr(self, k) for k in LLAMACPP_KNOBS))
        # A knob of another runtime away from its default would be recorded but never applied.
        stray = [k for k in other_knobs(self.runtime) if getattr(self, k) != _DEFAULTS[k]]
        if stray:
            raise ValueError(f"{', '.join(stray)} {'does' if len(stray) == 1 else 'do'} not apply to the "
                             f"{self.runtime} runtime")

    @classmethod
    def from_dict(cls, data: dict) -> DeployConfig:
        """From a stored configuration (a trial's `config`, a recipe's `configuration`), including those written
        before the dtype knob: their scheme "bf16" is quant "none" computing in bf16."""
        return cls(**_upgraded(data))

    @classmethod
    def from_params(cls, params: dict) -> DeployConfig:
        """From search-space parameters, where layers_per_subgraph may be the string "all"."""
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(unknown)}; known: {sorted(known)}")
        values = _upgraded(params)
        lps = values.get("layers_per_subgraph")
        if lps == "all":
            values["layers_per_subgraph"] = 0
        elif lps is not None:
            values["layers_per_subgraph"] = int(lps)
        if values.get("fusion_level", "O0") == "O0":
            values["layers_per_subgraph"] = None
        return cls(**values)

    def to_dict(self) -> dict:
        """The runtime's own knobs and the shared ones, the runtime named unless it is the default: a configuration
        of the engine reads as it did before llama.cpp's knobs existed, one of llama.cpp carries none of the
        engine's."""
        other = other_knobs(self.runtime)
        values = {k: v for k, v in asdict(self).items() if k not in other}
        if not runtime_of(self.runtime).named:
            del values["runtime"]
        return values

    def _keyed(self, names) -> dict:
        out = {k: getattr(self, k) for k in names if k not in _LATER_KNOBS or _DEFAULTS[k] != getattr(self, k)}
        if out.get("quant") == "none" and "dtype" not in out:
            out["quant"] = "bf16"  # what quant none in bf16 was called: its digest and gate key stay the same
        return out

    def numerics_key(self) -> str:
        """Stable key of the knobs that change numerics (see NUMERICS_KNOBS), of this configuration's runtime."""
        other = other_knobs(self.runtime)
        return json.dumps(self._keyed(k for k in NUMERICS_KNOBS if k not in other), sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self._keyed(self.to_dict()), sort_keys=True).encode()).hexdigest()[:12]

    def scheme_label(self) -> str:
        """The numerics in a word: "fp32", "w4a16+awq+fb2@bf16", "gguf:Q8_0" (its runtime's, config/runtimes.py)."""
        return RUNTIMES[self.runtime].scheme_label(self)

    def label(self) -> str:
        return RUNTIMES[self.runtime].label(self)


# Every knob's default, as the class declares it: what a knob of the other runtime must stay at, and what a later
# knob is left out of keys at.
_DEFAULTS = {f.name: f.default for f in fields(DeployConfig)}
