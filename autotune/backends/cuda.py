"""NVIDIA GPUs as a backend: each trial in its own process on the CUDA device (autotune/devices/cuda.py)."""
from __future__ import annotations

from autotune.backends.accelerator import AcceleratorBackend
from autotune.devices.cuda import CudaDevice, cuda_unavailable

__all__ = ["CudaBackend"]


class CudaBackend(AcceleratorBackend):
    name = "cuda"

    def unavailable(self) -> str | None:
        return cuda_unavailable()

    def device(self) -> CudaDevice:
        return CudaDevice()

    def fingerprint(self) -> dict:
        import torch

        props = torch.cuda.get_device_properties(0)
        slug = "-".join(w for w in props.name.lower().replace("nvidia", "").split() if w.isalnum())[:40]
        return {
            "hardware": f"cuda-{slug or 'gpu'}",
            "gpu": props.name, "capability": f"{props.major}.{props.minor}",
            "memory_gib": round(props.total_memory / 2**30, 1), "multiprocessors": props.multi_processor_count,
            "cuda": torch.version.cuda, "devices": torch.cuda.device_count(),
        }
