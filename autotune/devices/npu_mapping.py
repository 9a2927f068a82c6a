"""Our knobs -> torchair and torch_npu settings, as pure data: no torch_npu import, so it is tested everywhere.

Sources (read before writing this): torchair's `CompilerConfig` (configs/compiler_config.py) has `mode`, an
OptionValue of "max-autotune" (GE graph: the whole FX graph compiled by Ascend's Graph Engine, the default) or
"reduce-overhead" (aclgraph: captured launches, no GE fusion); `ge_config.oo_level` (configs/ge_config.py) is an
OptionValue of "O1" or "O3" (default O3), passed to GE as `ge.oo.level`: O1 basic optimisation, O3 every graph
fusion pass. torch_npu's quantized matmuls: `npu_weight_quant_batchmatmul(x, weight, antiquant_scale, ...)`
(int8 weights dequantised in the kernel, activations fp16/bf16) and `npu_quant_matmul(x1, x2, scale, *,
pertoken_scale=..., output_dtype=...)` after `npu_dynamic_quant(x)` (per-token symmetric int8 activations)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TorchairSettings", "torchair_settings", "NPU_QUANT_OPS", "npu_quant_op", "NPU_UNSUPPORTED_QUANT",
           "NPU_UNSUPPORTED_METHODS", "npu_power_reason"]


@dataclass(frozen=True, slots=True)
class TorchairSettings:
    """The CompilerConfig fields one fusion level sets: `config.mode = mode`, `config.ge_config.oo_level =
    oo_level`; `dynamic` is torch.compile's. True: prefill is one dynamic GE graph and decode static graphs, its
    inputs marked static before each call (autotune/devices/npu_graph.py says why dynamic=False cannot give that)."""

    mode: str
    oo_level: str
    dynamic: bool = True


# O0: eager (single operators, no torchair). O1: GE graph with only basic optimisation, the safe fused level.
# O2: GE graph with every fusion pass (oo_level O3) — the recipe's O2, whose fused chains drift after ~200-300
# tokens in fp16 (the reference deployment's experience): that is what the gate's drift check is for.
_FUSION: dict[str, TorchairSettings | None] = {
    "O0": None,
    "O1": TorchairSettings(mode="max-autotune", oo_level="O1"),
    "O2": TorchairSettings(mode="max-autotune", oo_level="O3"),
}


def torchair_settings(fusion_level: str) -> TorchairSettings | None:
    """The torchair settings of a fusion level; None for eager. Unknown levels raise KeyError."""
    return _FUSION[fusion_level]


# Scheme -> the torch_npu operators of its linear layer (None: a plain matmul in the dtype).
NPU_QUANT_OPS: dict[str, tuple[str, ...] | None] = {
    "none": None,
    "w8a16": ("npu_weight_quant_batchmatmul",),
    "w8a8": ("npu_dynamic_quant", "npu_quant_matmul"),
}

# Schemes in our space that the NPU backend does not run yet, with the reason recorded in the space.
# Quantization methods the NPU path cannot run (the others wrap the NPU's own quantized linears).
NPU_UNSUPPORTED_METHODS: dict[str, str] = {
    "smoothquant_static": ("static activation scales on the NPU need npu_quant_matmul fed by npu_quantize with the "
                           "calibrated per-tensor scale (msModelSlim's W8A8 input_scale/input_offset); not wired yet"),
}
NPU_UNSUPPORTED_QUANT: dict[str, str] = {
    "w4a16": ("int4 weights on the NPU need torch_npu.npu_convert_weight_to_int4pack and per-group antiquant "
              "scales in npu_weight_quant_batchmatmul; not wired yet (msModelSlim's quant types are w8a16, w8a8, "
              "w4a8)"),
}


def npu_quant_op(scheme: str) -> tuple[str, ...] | None:
    """The torch_npu operators a scheme's linear layers call; KeyError for a scheme the NPU does not run."""
    return NPU_QUANT_OPS[scheme]


def npu_power_reason(chip: str | None) -> str:
    """Why device_power is dropped on this Ascend part. Data-center 910/910B cards have no user-settable AI Core
    clock or power cap (`npu-smi info -t freq` only reads); only Atlas 200I/500 A2 edge boards offer frequency
    presets, and those are not wired here. There is no chip for which the dimension is kept yet."""
    name = (chip or "").lower()
    if "200i" in name or "500 a2" in name or "310b" in name:
        return (f"{chip} has npu-smi frequency presets, but autotune does not set them yet "
                "(device_power is not searched)")
    return (f"{chip or 'this Ascend card'} has no user-settable AI Core clock or power limit: "
            "npu-smi info -t freq only reads it on data-center 910/910B parts")
