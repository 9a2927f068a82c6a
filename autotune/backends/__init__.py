"""Backends by name: each implements autotune.backends.base.Backend."""
from __future__ import annotations

from autotune.backends.base import Backend
from autotune.backends.cpu import CpuBackend
from autotune.errors import BackendUnavailable

__all__ = ["Backend", "BACKENDS", "get_backend"]

BACKENDS: dict[str, type[Backend]] = {"cpu": CpuBackend}


def get_backend(name: str) -> Backend:
    if name not in BACKENDS:
        planned = {"cuda": "CUDA", "npu": "Ascend NPU (torch_npu)", "sim": "the analytical simulator"}
        if name in planned:
            raise BackendUnavailable(f"backend {name!r} ({planned[name]}) is not built yet; available: "
                                     f"{', '.join(BACKENDS)}")
        raise BackendUnavailable(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")
    backend = BACKENDS[name]()
    reason = backend.unavailable()
    if reason:
        raise BackendUnavailable(f"backend {name!r} cannot run here: {reason}")
    return backend
