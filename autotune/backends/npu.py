"""Ascend NPUs as a backend: each trial in its own process on the NPU device (autotune/devices/npu.py)."""
from __future__ import annotations

from autotune.backends.accelerator import AcceleratorBackend
from autotune.devices.npu import NpuDevice, chip_name, npu_module, npu_unavailable

__all__ = ["NpuBackend"]


class NpuBackend(AcceleratorBackend):
    name = "npu"

    def unavailable(self) -> str | None:
        return npu_unavailable()

    def device(self) -> NpuDevice:
        return NpuDevice()

    def fingerprint(self) -> dict:
        from importlib.metadata import version

        import torch

        npu = npu_module()
        chip = chip_name() or "ascend"
        return {"hardware": f"npu-{chip.lower().replace(' ', '-')}", "npu": chip, "devices": npu.device_count(),
                "torch": torch.__version__, "torch_npu": version("torch-npu")}
