"""autotune's own engine's knobs (the torch runtime): numerics (dtype, quantization scheme, its method and kept
layers), operator fusion and graph split, and the paged KV cache. Frozen and validated on construction; the shared
knobs (batch, device power) are DeployConfig's."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autotune.config.choices import check_choices

__all__ = ["EngineKnobs", "DTYPES", "DTYPE_BYTES", "TORCH_DTYPE_NAMES", "QUANT_SCHEMES", "QUANT_METHODS",
           "FALLBACK_LAYERS", "FUSION_LEVELS", "KV_POLICIES", "LEGACY_SCHEMES"]

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
# The schemes that quantize weights only (activations stay in the compute dtype): where a bigger model's decode
# reads more weight bytes per step, these are what should pay.
WEIGHT_ONLY_SCHEMES = ("w8a16", "w4a16")
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
# The scheme names of configurations written before the dtype knob: old name -> (scheme, dtype).
LEGACY_SCHEMES = {"bf16": ("none", "bf16")}


@dataclass(frozen=True, slots=True)
class EngineKnobs:
    """`layers_per_subgraph` is 0 for "all layers in one graph" and is only meaningful when fused (O1/O2); eager
    (O0) configurations carry None."""

    RUNTIME: ClassVar[str] = "engine"
    # Only these change what the model computes; the rest change speed and memory. Gate results are keyed by them.
    NUMERICS: ClassVar[tuple[str, ...]] = ("dtype", "quant", "fusion_level", "layers_per_subgraph", "quant_method",
                                           "fallback_layers")
    # Added after recipes were first named by digest: left out of digests and numerics keys while at their
    # defaults, so that a configuration that does not use them keeps its digest (its recipe's file name) and its
    # gate key.
    LATER: ClassVar[tuple[str, ...]] = ("quant_method", "fallback_layers", "dtype", "prefill_chunk")
    # What the simulator reads of these (a step's cost; the prefill chunk, how its serving run schedules prompts:
    # sim/served.py), the rest changing accuracy and little it could predict; and of those the knobs that name a
    # numerics scheme to the guide (study/guide.py).
    MODELED: ClassVar[tuple[str, ...]] = ("dtype", "quant", "fusion_level", "layers_per_subgraph", "page_size",
                                          "kv_policy", "prefill_chunk")
    SCHEME: ClassVar[tuple[str, ...]] = ("quant", "dtype")
    # The knobs with a fixed set of values (a space file's values are checked against these too).
    CHOICES: ClassVar[dict[str, tuple]] = {"dtype": DTYPES, "quant": QUANT_SCHEMES, "fusion_level": FUSION_LEVELS,
                                           "kv_policy": KV_POLICIES}

    # Default bf16: what every configuration computed in before the knob existed, so that old ones read the same.
    dtype: str = "bf16"
    quant: str = "none"
    quant_method: str = "rtn"  # one of QUANT_METHODS[quant]
    fallback_layers: int = 0  # the most sensitive decoder linear layers kept in the compute dtype
    fusion_level: str = "O0"
    layers_per_subgraph: int | None = None
    page_size: int = 128
    kv_policy: str = "on_demand"
    # Prompt tokens one serving step may prefill beside the running decodes (0: every admitted prompt at once).
    # Serving and the goodput probes run it; the offline benchmark prefills whole prompts, which it does not change.
    prefill_chunk: int = 256

    def __post_init__(self) -> None:
        if self.quant in LEGACY_SCHEMES:
            scheme, dtype = LEGACY_SCHEMES[self.quant]
            raise ValueError(f"quant {self.quant!r} is now quant {scheme!r} with dtype {dtype!r}")
        check_choices(self)
        if self.quant_method not in QUANT_METHODS[self.quant]:
            raise ValueError(f"quant_method for {self.quant} must be one of {QUANT_METHODS[self.quant]}, "
                             f"not {self.quant_method!r}")
        if self.fallback_layers < 0 or (self.quant == "none" and self.fallback_layers):
            raise ValueError(f"fallback_layers must be >= 0, and 0 for quant none (nothing is quantized); "
                             f"not {self.fallback_layers}")
        if self.fusion_level == "O0" and self.layers_per_subgraph is not None:
            raise ValueError("layers_per_subgraph applies only to fused levels (O1, O2)")
        if self.fusion_level != "O0" and (self.layers_per_subgraph is None or self.layers_per_subgraph < 0):
            raise ValueError("fused levels need layers_per_subgraph >= 1, or 0 for all layers")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, not {self.page_size}")
        if self.prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be >= 0 (0: whole prompts), not {self.prefill_chunk}")

    def keyed(self, values: dict) -> dict:
        """`values` (a configuration's, for a digest or a numerics key) as keys have always read them: the later
        knobs left out at their defaults, and quant none in bf16 under its old name "bf16"."""
        out = {k: v for k, v in values.items() if k not in self.LATER or _DEFAULTS[k] != v}
        if out.get("quant") == "none" and "dtype" not in out:
            out["quant"] = "bf16"
        return out

    def cost_knobs(self) -> dict | None:
        """What the simulator's cost of a step reads (sim/cost.py): the weights' scheme, the precision the matmuls
        compute in, the KV page size."""
        return {"quant": self.quant, "dtype": self.dtype, "page_size": self.page_size}

    def reads_calibration(self) -> bool:
        """Whether the build reads the calibration set (a calibrated method, or layers kept by sensitivity)."""
        return self.quant_method != "rtn" or self.fallback_layers > 0

    def scheme_label(self) -> str:
        """The precision alone ("fp32") for quant none, else the scheme with its method and fallback where they are
        not the defaults and the precision it computes in: "w4a16+awq+fb2@bf16"."""
        if self.quant == "none":
            return self.dtype
        method = "" if self.quant_method == "rtn" else f"+{self.quant_method}"
        fallback = f"+fb{self.fallback_layers}" if self.fallback_layers else ""
        return f"{self.quant}{method}{fallback}@{self.dtype}"

    def label(self, batch_size: int, device_power: int) -> str:
        split = "" if self.layers_per_subgraph is None else f"/split={self.layers_per_subgraph or 'all'}"
        chunk = "" if self.prefill_chunk == _DEFAULT_CHUNK else f"/chunk={self.prefill_chunk or 'whole'}"
        return (f"{self.scheme_label()}/{self.fusion_level}{split}/bs={batch_size}/page={self.page_size}"
                f"/{self.kv_policy}{chunk}/power={device_power}")


_DEFAULTS = {name: getattr(EngineKnobs(), name) for name in EngineKnobs.__dataclass_fields__}
_DEFAULT_CHUNK = _DEFAULTS["prefill_chunk"]
