"""Devices by name, for the trial's child process (it is told the device kind by its backend)."""
from __future__ import annotations

from autotune.devices.base import Device
from autotune.devices.cpu import CpuDevice
from autotune.devices.cuda import CudaDevice
from autotune.devices.npu import NpuDevice
from autotune.errors import BackendUnavailable

__all__ = ["DEVICES", "get_device"]

# The CUDA and NPU modules import their packages (torch.cuda is built in; torch_npu is optional) only when a
# device is used, so this table loads on any machine.
DEVICES: dict[str, type[Device]] = {"cpu": CpuDevice, "cuda": CudaDevice, "npu": NpuDevice}


def get_device(name: str) -> Device:
    if name not in DEVICES:
        raise BackendUnavailable(f"no device {name!r}; known: {', '.join(DEVICES)}")
    return DEVICES[name]()
