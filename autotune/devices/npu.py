"""An Ascend NPU through torch_npu and torchair: fusion levels compile to GE graphs (autotune/devices/npu_mapping.py),
quantized linears call torch_npu's fused matmuls, memory comes from torch.npu's allocator, timing waits on
torch.npu.synchronize. Not yet run on hardware in this project."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from autotune.devices.base import CompileOptions, Device, Limit
from autotune.devices.npu_mapping import (
    NPU_UNSUPPORTED_METHODS,
    NPU_UNSUPPORTED_QUANT,
    npu_power_reason,
    torchair_settings,
)
from autotune.probe.accelerators import npu_capabilities
from autotune.probe.capabilities import Capabilities

if TYPE_CHECKING:
    from autotune.engine.quant import Quantizer

__all__ = ["NpuDevice", "npu_unavailable", "npu_module", "chip_name"]

_INSTALL = "pip install 'autotune[npu]' (torch_npu 2.13.0, for torch 2.13.0) with the Ascend CANN toolkit"


def npu_unavailable() -> str | None:
    """Why NPU trials cannot run here, in one line naming what to install; None when they can."""
    if importlib.util.find_spec("torch_npu") is None:
        return f"torch_npu is not installed: {_INSTALL}"
    try:
        import torch
        import torch_npu  # noqa: F401 - registers torch.npu
    except Exception as exc:  # noqa: BLE001 - a broken CANN install shows as any import error
        return f"torch_npu does not load ({type(exc).__name__}: {exc}); check the CANN toolkit (set_env.sh)"
    if not torch.npu.is_available():
        return "torch_npu is installed but sees no NPU (check npu-smi info and ASCEND_RT_VISIBLE_DEVICES)"
    try:
        import torchair  # noqa: F401 - torch_npu registers it (a lazy module) when it loads
    except ImportError:
        return "torchair is not importable: it ships with torch_npu 2.13.0; reinstall torch_npu"
    return None


def npu_module():
    import torch
    import torch_npu  # noqa: F401 - registers torch.npu

    return torch.npu


class NpuDevice(Device):
    name = "npu"
    torch_device = "npu"

    def synchronize(self) -> None:
        npu_module().synchronize()

    def reset_peak_memory(self) -> None:
        npu = npu_module()
        npu.synchronize()
        npu.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int:
        return int(npu_module().max_memory_allocated())

    def compile_options(self, fusion_level: str) -> CompileOptions | None:
        settings = torchair_settings(fusion_level)
        if settings is None:
            return None
        return CompileOptions("torchair", mode=settings.mode,
                              settings={"oo_level": settings.oo_level, "dynamic": settings.dynamic})

    def compile(self, fn: Callable, fusion_level: str) -> Callable:
        options = self.compile_options(fusion_level)
        if options is None:
            return fn
        import torch_npu  # noqa: F401 - torchair must be imported after torch_npu
        import torchair

        from autotune.devices.npu_graph import torchair_compile

        config = torchair.CompilerConfig()
        config.mode = options.mode
        config.ge_config.oo_level = options.settings["oo_level"]
        backend = torchair.get_npu_backend(compiler_config=config)
        return torchair_compile(fn, backend, options.settings["dynamic"])

    def quantizer(self, scheme: str) -> Quantizer:
        from autotune.devices.npu_quant import NPU_QUANTIZERS

        return NPU_QUANTIZERS[scheme]()

    def limits(self) -> list[Limit]:
        return [Limit("quant", (scheme,), reason) for scheme, reason in NPU_UNSUPPORTED_QUANT.items()] + [
            Limit("quant_method", (method,), reason) for method, reason in NPU_UNSUPPORTED_METHODS.items()] + [
            Limit("device_power", None, npu_power_reason(chip_name()))]

    def capabilities(self) -> Capabilities:
        return npu_capabilities(chip_name())


def chip_name() -> str | None:
    """The card's name from torch_npu where it loads (e.g. "Ascend910B2"); None elsewhere."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return str(npu_module().get_device_name(0))
    except Exception:  # noqa: BLE001 - no card or no driver: the reason falls back to a generic one
        return None
