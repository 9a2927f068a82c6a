"""The frozen deployment configuration: one point of the search space, validated on construction."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields

__all__ = ["DeployConfig", "NUMERICS_KNOBS", "QUANT_SCHEMES", "FUSION_LEVELS", "KV_POLICIES"]

QUANT_SCHEMES = ("bf16", "w8a16", "w8a8", "w4a16")
FUSION_LEVELS = ("O0", "O1", "O2")
KV_POLICIES = ("preallocate", "on_demand", "pool")
# Only these change what the model computes; the rest change speed and memory. Gate results are keyed by them.
NUMERICS_KNOBS = ("quant", "fusion_level", "layers_per_subgraph")


@dataclass(frozen=True, slots=True)
class DeployConfig:
    """How one model is deployed. `layers_per_subgraph` is 0 for "all layers in one graph" and is only
    meaningful when fused (O1/O2); eager (O0) configurations carry None."""

    quant: str = "bf16"
    fusion_level: str = "O0"
    layers_per_subgraph: int | None = None
    batch_size: int = 8
    page_size: int = 128
    kv_policy: str = "on_demand"
    device_power: int = 0  # backend-defined level; on the CPU the number of threads (0: all cores)

    def __post_init__(self) -> None:
        if self.quant not in QUANT_SCHEMES:
            raise ValueError(f"quant must be one of {QUANT_SCHEMES}, not {self.quant!r}")
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

    @classmethod
    def from_params(cls, params: dict) -> DeployConfig:
        """From search-space parameters, where layers_per_subgraph may be the string "all"."""
        known = {f.name for f in fields(cls)}
        unknown = set(params) - known
        if unknown:
            raise ValueError(f"unknown configuration keys {sorted(unknown)}; known: {sorted(known)}")
        values = dict(params)
        lps = values.get("layers_per_subgraph")
        if lps == "all":
            values["layers_per_subgraph"] = 0
        elif lps is not None:
            values["layers_per_subgraph"] = int(lps)
        if values.get("fusion_level", "O0") == "O0":
            values["layers_per_subgraph"] = None
        return cls(**values)

    def to_dict(self) -> dict:
        return asdict(self)

    def numerics_key(self) -> str:
        """Stable key of the knobs that change numerics (see NUMERICS_KNOBS)."""
        return json.dumps({k: getattr(self, k) for k in NUMERICS_KNOBS}, sort_keys=True)

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:12]

    def label(self) -> str:
        split = "" if self.layers_per_subgraph is None else f"/split={self.layers_per_subgraph or 'all'}"
        return (f"{self.quant}/{self.fusion_level}{split}/bs={self.batch_size}/page={self.page_size}"
                f"/{self.kv_policy}/power={self.device_power}")
