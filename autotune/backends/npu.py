"""An Ascend NPU through torch_npu and torchair: fusion levels compile to GE graphs (autotune/backends/npu_mapping.py),
quantized linears call torch_npu's fused matmuls, memory comes from torch.npu's allocator, timing waits on
torch.npu.synchronize. Each trial runs in its own process. Not yet run on hardware in this project."""
from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from autotune.backends.accelerator import AcceleratorBackend
from autotune.backends.device import CompileOptions, Device, Limit
from autotune.backends.npu_mapping import NPU_UNSUPPORTED_QUANT, npu_power_reason, torchair_settings

if TYPE_CHECKING:
    from autotune.engine.quant import Quantizer

__all__ = ["NpuDevice", "NpuBackend", "npu_unavailable"]

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


def _npu():
    import torch
    import torch_npu  # noqa: F401 - registers torch.npu

    return torch.npu


class NpuDevice(Device):
    name = "npu"
    torch_device = "npu"

    def synchronize(self) -> None:
        _npu().synchronize()

    def reset_peak_memory(self) -> None:
        npu = _npu()
        npu.synchronize()
        npu.reset_peak_memory_stats()

    def peak_memory_bytes(self) -> int:
        return int(_npu().max_memory_allocated())

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
        import torch
        import torch_npu  # noqa: F401 - torchair must be imported after torch_npu
        import torchair

        config = torchair.CompilerConfig()
        config.mode = options.mode
        config.ge_config.oo_level = options.settings["oo_level"]
        backend = torchair.get_npu_backend(compiler_config=config)
        return torch.compile(fn, backend=backend, dynamic=options.settings["dynamic"])

    def quantizer(self, scheme: str) -> Quantizer:
        from autotune.backends.npu_quant import NPU_QUANTIZERS

        return NPU_QUANTIZERS[scheme]()

    def limits(self) -> list[Limit]:
        return [Limit("quant", (scheme,), reason) for scheme, reason in NPU_UNSUPPORTED_QUANT.items()] + [
            Limit("device_power", None, npu_power_reason(_chip_name()))]


def _chip_name() -> str | None:
    """The card's name from torch_npu where it loads (e.g. "Ascend910B2"); None elsewhere."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return str(_npu().get_device_name(0))
    except Exception:  # noqa: BLE001 - no card or no driver: the reason falls back to a generic one
        return None


class NpuBackend(AcceleratorBackend):
    name = "npu"

    def unavailable(self) -> str | None:
        return npu_unavailable()

    def device(self) -> NpuDevice:
        return NpuDevice()

    def fingerprint(self) -> dict:
        from importlib.metadata import version

        import torch

        npu = _npu()
        chip = _chip_name() or "ascend"
        return {"hardware": f"npu-{chip.lower().replace(' ', '-')}", "npu": chip, "devices": npu.device_count(),
                "torch": torch.__version__, "torch_npu": version("torch-npu")}
