"""What an accelerator computes natively, from what it reports about itself (no microbenchmark: the rules are the
vendors' own). CUDA: bf16 from compute capability 8.0 (Ampere), fp8 from 8.9 (Ada, Hopper). Ascend: the first
910 generation computes fp16 on its cube units and has no bf16; the 910B (and 910_93) adds bf16."""
from __future__ import annotations

import re

from autotune.probe.capabilities import Capabilities, Precision

__all__ = ["cuda_capabilities", "npu_capabilities"]

_NPU_FP32 = ("the Ascend cube units multiply fp16 and bf16 (and int8); fp32 is no deployment precision there "
             "(the gate's fp32 reference runs on the host)")


def cuda_capabilities(name: str, capability: tuple[int, int]) -> Capabilities:
    """`capability`: torch.cuda.get_device_capability(). Tensor cores run bf16 and fp16 at the same rate, far
    above fp32 (A100: 312 against 19.5 TFLOPS dense): bf16 first where it is native, else fp16."""
    cc = f"sm{capability[0]}{capability[1]}"
    bf16 = capability >= (8, 0)
    precisions = [
        Precision("bf16", bf16, bf16, f"{'native' if bf16 else 'no bf16 tensor cores'} on {cc} "
                                      f"(bf16 needs sm80, Ampere, or newer)"),
        Precision("fp16", True, True, f"fp16 tensor cores on {cc}"),
        Precision("fp32", True, True, f"native on {cc}, at a fraction of the tensor-core rate"),
    ]
    ordered = sorted(precisions, key=lambda p: (not p.offered, ["bf16", "fp16", "fp32"].index(p.name)))
    return Capabilities("cuda", name, tuple(ordered),
                        figures={"compute_capability": list(capability), "fp8": capability >= (8, 9)})


def _generation(soc: str) -> str:
    """"910b" for the 910B family (SoC names Ascend910B1..B4, Ascend910_93xx), "910" for the first generation
    (Ascend910A, Ascend910ProA, Ascend910ProB, Ascend910PremiumA: its "ProB" is not a 910B)."""
    if re.match(r"Ascend910B\d", soc) or soc.startswith("Ascend910_93"):
        return "910b"
    if soc.startswith("Ascend910"):
        return "910"
    return "unknown"


def npu_capabilities(soc: str | None) -> Capabilities:
    """`soc`: the SoC name torch_npu reports (torch.npu.get_device_name). An unknown one keeps what every
    Ascend training part computes, fp16."""
    soc = soc or "unknown Ascend NPU"
    generation = _generation(soc)
    bf16 = generation == "910b"
    why_bf16 = (f"native on {soc} (the 910B generation's cube units)" if bf16 else
                f"{soc} is the first 910 generation (or unknown): its cube units compute fp16, bf16 arrived with "
                "the 910B")
    precisions = (Precision("bf16", bf16, bf16, why_bf16), Precision("fp16", True, True, f"native on {soc}"),
                  Precision("fp32", False, False, _NPU_FP32))
    ordered = sorted(precisions, key=lambda p: (not p.offered, ["bf16", "fp16", "fp32"].index(p.name)))
    return Capabilities("npu", soc, tuple(ordered), figures={"generation": generation})
